//! virtio-9p (device id 9): host directories shared with the guest over 9P2000.L.
//!
//! **Slots.** Every VM has [`SHARE_SLOTS`] devices, tags `voidbox0` … `voidbox3`, after
//! vsock on the bus, whether or not a directory is bound to them: the guest kernel probes
//! them at boot, so a golden snapshot (taken before anything is mounted) holds all of them,
//! and each launch binds slot `i` to `VmConfig::shares[i]` or leaves it unbound — on a cold
//! boot and on a restore alike. The guest agent mounts a slot on the host's request, after
//! the VM is up ([`share`] serves it; an unbound slot refuses `Tattach` with `ENOENT`).
//!
//! **Snapshots: the transport and the queue only.** A snapshot holds what block holds:
//! the negotiated features, the device's queue and counters ([`persist`]). Nothing of the 9P
//! session is saved: its fids are host descriptors, meaningless in another process. That is
//! sound because golden snapshots are taken before any mount, when no fid exists; a snapshot
//! of a device with live fids (something mounted) is refused instead of saving a guest whose
//! mounts would point at nothing. A restored VM binds the directories of its own config.
//!
//! **Where requests run.** As for block: synchronously on the vCPU thread that writes
//! QueueNotify, inside that MMIO exit, so a paused vCPU has answered everything it notified
//! and the queue state is the whole story for a snapshot. A request on a slow host file
//! system (a large `fsync`, a huge directory) stalls that vCPU meanwhile; a FIFO in a shared
//! directory opened without `O_NONBLOCK` would stall it until a writer appears (the guest
//! cannot create one: `mknod` is refused).
//!
//! **What the guest controls is checked.** Each chain is walked with at most
//! [`MAX_CHAIN_DESCS`] descriptors, each inside guest memory, device-readable before
//! device-writable ([`super::virtio::queue`]); the request is gathered from the readable part
//! only up to the size its header names, at most [`share::MAX_MSIZE`]; the reply is scattered
//! into the writable part, never beyond it. A request without a complete header is dropped
//! (used length 0, which the guest driver reports as an error) with a log line; one whose
//! header names more bytes than the chain carries, or more than the maximum, is answered
//! `Rlerror`; a chain that cannot be walked (a loop, a buffer outside memory) marks the
//! device broken (DEVICE_NEEDS_RESET) and the VMM carries on. Nothing here panics on guest
//! input.

#[doc(hidden)]
pub mod fuzz;
pub mod persist;
pub mod share;
pub mod wire;

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::Queue;

pub use self::share::{Share, ShareStats, MAX_MSIZE};
use super::virtio::queue::{read_gather, total_len, write_scatter, ChainError, Desc};
use super::virtio::request_queue::{RequestDevice, RequestQueue};
use super::virtio::{
    read_config_bytes, ActivateError, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1,
};
pub use crate::config::SHARE_SLOTS;
use crate::exit::VmEvent;
use crate::memory::GuestMem;

/// virtio device id of a 9P transport.
pub const P9_DEVICE_ID: u32 = 9;
/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Longest descriptor chain accepted (a 512000-byte zero-copy request from Linux uses 127).
pub const MAX_CHAIN_DESCS: usize = QUEUE_SIZE as usize;
/// Feature bit: the config space holds the mount tag.
pub const VIRTIO_9P_MOUNT_TAG: u32 = 0;
/// Name of the device in the snapshot key's device set.
pub const SNAPSHOT_NAME: &str = "p9";

const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// The mount tag of slot `slot` (`voidbox0` …).
pub fn tag(slot: usize) -> String {
    format!("voidbox{slot}")
}

/// The features offered.
pub fn offered_features() -> u64 {
    (1u64 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_9P_MOUNT_TAG)
}

/// One share slot's device state, shared by the MMIO transport (which owns the
/// [`P9Device`]) and the snapshot code.
pub struct P9 {
    slot: usize,
    share: Share,
    requests: RequestQueue,
    dropped: u64,
}

impl P9 {
    /// Slot `slot` serving `share`, raising `irq`, reporting a broken queue to `events`.
    pub fn new(
        slot: usize,
        share: Share,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Self {
        Self {
            slot,
            share,
            requests: RequestQueue::new(format!("p9 {}", tag(slot)), MAX_CHAIN_DESCS, irq, events),
            dropped: 0,
        }
    }

    /// The slot number.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The share it serves.
    pub fn share(&self) -> &Share {
        &self.share
    }

    /// Requests dropped without a reply (no complete header).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Why the device is broken, if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.requests.broken_reason()
    }

    /// True between activation and reset, unless broken.
    pub fn is_active(&self) -> bool {
        self.requests.is_active()
    }

    /// The config space: `tag_len[2]` and the tag.
    fn config_space(&self) -> Vec<u8> {
        let tag = tag(self.slot);
        let mut c = Vec::with_capacity(2 + tag.len());
        c.extend_from_slice(&(tag.len() as u16).to_le_bytes());
        c.extend_from_slice(tag.as_bytes());
        c
    }

    /// Takes the driver's queue (DRIVER_OK).
    pub fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        self.requests.activate(mem, queues, acked_features)
    }

    /// Device reset: forget the queue (the 9P session stays: the guest starts a new one with
    /// `Tversion`, which drops every fid).
    pub fn reset(&mut self) {
        self.requests.reset();
    }

    /// Marks the device broken: processing stops, the driver sees DEVICE_NEEDS_RESET.
    pub fn mark_broken(&mut self, why: String) {
        self.requests.mark_broken(why);
    }

    /// Answers every available request; returns true when used buffers were added (the
    /// interrupt is then raised).
    pub fn process_queue(&mut self) -> bool {
        self.process_requests()
    }

    /// Answers one validated chain; returns the bytes written into it.
    fn serve(&mut self, mem: &GuestMem, descs: &[Desc]) -> Result<u32, ChainError> {
        let readable = total_len(descs, false);
        let writable =
            usize::try_from(total_len(descs, true).min(u64::from(u32::MAX))).unwrap_or(usize::MAX);
        let mut head = [0u8; wire::HEADER_LEN];
        if readable < wire::HEADER_LEN as u64
            || writable < wire::RLERROR_LEN
            || read_gather(mem, descs, 0, &mut head).is_err()
        {
            self.drop_request(readable, writable);
            return Ok(0);
        }
        let Some(h) = wire::Header::parse(&head) else {
            self.drop_request(readable, writable);
            return Ok(0);
        };
        let size = h.size as usize;
        let reply = if h.size > MAX_MSIZE {
            log::debug!(
                "p9 {}: request of {} bytes refused (msize is at most {MAX_MSIZE})",
                tag(self.slot),
                h.size
            );
            wire::rlerror(h.tag, libc::EMSGSIZE)
        } else if size < wire::HEADER_LEN || (size as u64) > readable {
            log::debug!(
                "p9 {}: request names {size} bytes, the chain carries {readable}",
                tag(self.slot)
            );
            wire::rlerror(h.tag, libc::EINVAL)
        } else {
            let mut msg = vec![0u8; size];
            read_gather(mem, descs, 0, &mut msg)?;
            match self.share.handle(&mut msg, writable) {
                Some(r) => r,
                None => wire::rlerror(h.tag, libc::EINVAL),
            }
        };
        write_scatter(mem, descs, 0, &reply)?;
        Ok(reply.len() as u32)
    }

    fn drop_request(&mut self, readable: u64, writable: usize) {
        self.dropped += 1;
        log::warn!(
            "p9 {}: request dropped: no room for a header ({readable} bytes readable, {writable} writable)",
            tag(self.slot)
        );
    }
}

impl RequestDevice for P9 {
    fn requests(&mut self) -> &mut RequestQueue {
        &mut self.requests
    }

    fn answer(&mut self, mem: &GuestMem, descs: &[Desc]) -> Result<u32, String> {
        self.serve(mem, descs)
            .map_err(|e| format!("request queue: {e}"))
    }
}

/// Locks a 9p device, recovering from a poisoned lock.
pub fn lock(p: &Mutex<P9>) -> MutexGuard<'_, P9> {
    p.lock().unwrap_or_else(|p| p.into_inner())
}

/// The virtio side of a share slot, owned by the MMIO transport.
pub struct P9Device {
    p9: Arc<Mutex<P9>>,
}

impl P9Device {
    /// A device around `p9`.
    pub fn new(p9: Arc<Mutex<P9>>) -> Self {
        Self { p9 }
    }
}

impl VirtioDevice for P9Device {
    fn name(&self) -> &'static str {
        "p9"
    }

    fn device_type(&self) -> u32 {
        P9_DEVICE_ID
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        offered_features()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = lock(&self.p9).config_space();
        read_config_bytes(&cfg, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        log::debug!("p9: guest wrote read-only config space");
    }

    fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        lock(&self.p9).activate(mem, queues, acked_features)
    }

    fn queue_notify(&mut self, _index: u32) {
        lock(&self.p9).process_queue();
    }

    fn reset(&mut self) {
        lock(&self.p9).reset();
    }

    fn is_broken(&self) -> bool {
        lock(&self.p9).requests.is_broken()
    }
}

#[cfg(test)]
mod tests;
