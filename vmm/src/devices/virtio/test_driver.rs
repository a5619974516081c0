//! Test harness shared by the device tests: the driver's side of a split virtqueue laid out
//! in real guest memory, an interrupt line, and MMIO register access that brings a transport
//! up as a driver would.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{reg, MmioTransport};
use super::{status, Interrupt};
use crate::bus::BusDevice;
use crate::memory::GuestMem;

/// Descriptor flag: the chain continues at `next`.
pub const F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable.
pub const F_WRITE: u16 = 2;

/// One split virtqueue laid out at `base` (descriptor table, then the available ring at
/// `base + 0x4000` and the used ring at `base + 0x5000`), filled as a driver would.
pub struct DriverQueue {
    /// Address of the descriptor table.
    pub base: u64,
    /// Queue size (QueueNum).
    pub size: u16,
    /// The available ring's index (chains published so far).
    pub avail_idx: u16,
    /// Used entries taken by [`DriverQueue::used`] so far.
    pub used_seen: u16,
    /// Next free descriptor for [`DriverQueue::add_chain`].
    pub next_desc: u16,
}

impl DriverQueue {
    /// An empty queue of `size` entries at `base`.
    pub fn new(base: u64, size: u16) -> Self {
        Self {
            base,
            size,
            avail_idx: 0,
            used_seen: 0,
            next_desc: 0,
        }
    }

    /// Address of the descriptor table.
    pub fn desc_addr(&self) -> u64 {
        self.base
    }

    /// Address of the available (driver) ring.
    pub fn avail_addr(&self) -> u64 {
        self.base + 0x4000
    }

    /// Address of the used (device) ring.
    pub fn used_addr(&self) -> u64 {
        self.base + 0x5000
    }

    /// The ready queue a transport would hand a device offering `max_size` entries.
    pub fn queue(&self, max_size: u16) -> Queue {
        let mut q = Queue::new(max_size).unwrap();
        q.set_size(self.size);
        q.set_desc_table_address(Some(self.desc_addr() as u32), Some(0));
        q.set_avail_ring_address(Some(self.avail_addr() as u32), Some(0));
        q.set_used_ring_address(Some(self.used_addr() as u32), Some(0));
        q.set_ready(true);
        q
    }

    /// Writes descriptor `idx` as is (for hostile chains).
    pub fn write_desc(&self, mem: &GuestMem, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let a = self.desc_addr() + 16 * u64::from(idx);
        mem.write_obj(addr, GuestAddress(a)).unwrap();
        mem.write_obj(len, GuestAddress(a + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(a + 12)).unwrap();
        mem.write_obj(next, GuestAddress(a + 14)).unwrap();
    }

    /// Publishes the chain headed by `head` in the available ring.
    pub fn publish(&mut self, mem: &GuestMem, head: u16) {
        let slot = self.avail_addr() + 4 + 2 * u64::from(self.avail_idx % self.size);
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail_addr() + 2))
            .unwrap();
    }

    /// Adds and publishes a chain of (addr, len, writable) buffers; returns the head index.
    pub fn add_chain(&mut self, mem: &GuestMem, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc % self.size;
        let n = bufs.len() as u16;
        for (i, (addr, len, w)) in bufs.iter().enumerate() {
            let idx = (head + i as u16) % self.size;
            let last = i as u16 == n - 1;
            let flags = if last { 0 } else { F_NEXT } | if *w { F_WRITE } else { 0 };
            self.write_desc(mem, idx, *addr, *len, flags, (idx + 1) % self.size);
        }
        self.next_desc = self.next_desc.wrapping_add(n);
        self.publish(mem, head);
        head
    }

    /// Used entries added since the last call: (head, len).
    pub fn used(&mut self, mem: &GuestMem) -> Vec<(u16, u32)> {
        let idx: u16 = mem.read_obj(GuestAddress(self.used_addr() + 2)).unwrap();
        let mut out = Vec::new();
        while self.used_seen != idx {
            let e = self.used_addr() + 4 + 8 * u64::from(self.used_seen % self.size);
            let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
            out.push((id as u16, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    /// Writes the driver's `used_event` (EVENT_IDX): interrupt once the used index passes it.
    pub fn set_used_event(&self, mem: &GuestMem, v: u16) {
        let a = self.avail_addr() + 4 + 2 * u64::from(self.size);
        mem.write_obj(v, GuestAddress(a)).unwrap();
    }

    /// Reads the device's `avail_event` (EVENT_IDX): the driver notifies once it adds that
    /// entry.
    pub fn avail_event(&self, mem: &GuestMem) -> u16 {
        let a = self.used_addr() + 4 + 8 * u64::from(self.size);
        mem.read_obj(GuestAddress(a)).unwrap()
    }
}

/// The ready queues of `rings`, in order, for a device offering `max_size` entries each.
pub fn queues(rings: &[&DriverQueue], max_size: u16) -> Vec<Queue> {
    rings.iter().map(|r| r.queue(max_size)).collect()
}

/// A fresh interrupt line over a non-blocking eventfd.
pub fn irq() -> Arc<Interrupt> {
    Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
}

/// Reads the 32-bit MMIO register at `off`.
pub fn read_reg(t: &mut MmioTransport, off: u64) -> u32 {
    let mut d = [0u8; 4];
    t.read(off, &mut d);
    u32::from_le_bytes(d)
}

/// Writes the 32-bit MMIO register at `off`.
pub fn write_reg(t: &mut MmioTransport, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes());
}

/// Drives `t` to DRIVER_OK as a driver would: acknowledges `features`, sets up `queues` (queue
/// `i` is `queues[i]`), then writes DRIVER_OK.
pub fn bring_up(t: &mut MmioTransport, features: u64, queues: &[&DriverQueue]) {
    use status::*;
    write_reg(t, reg::STATUS, ACKNOWLEDGE);
    write_reg(t, reg::STATUS, ACKNOWLEDGE | DRIVER);
    write_reg(t, reg::DRIVER_FEATURES_SEL, 0);
    write_reg(t, reg::DRIVER_FEATURES, features as u32);
    write_reg(t, reg::DRIVER_FEATURES_SEL, 1);
    write_reg(t, reg::DRIVER_FEATURES, (features >> 32) as u32);
    write_reg(t, reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    for (i, q) in queues.iter().enumerate() {
        write_reg(t, reg::QUEUE_SEL, i as u32);
        write_reg(t, reg::QUEUE_NUM, u32::from(q.size));
        write_reg(t, reg::QUEUE_DESC_LOW, q.desc_addr() as u32);
        write_reg(t, reg::QUEUE_DRIVER_LOW, q.avail_addr() as u32);
        write_reg(t, reg::QUEUE_DEVICE_LOW, q.used_addr() as u32);
        write_reg(t, reg::QUEUE_READY, 1);
    }
    write_reg(
        t,
        reg::STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
}
