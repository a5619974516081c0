//! virtio-blk (device id 2): one file-backed disk, read-only or read-write, with flush.
//!
//! The guest sees the disks of a VM as `/dev/vda`, `/dev/vdb`, … in the order the VMM
//! attaches them. Offered features: `VERSION_1`, `SIZE_MAX` and `SEG_MAX` (so a request never
//! exceeds [`request::MAX_REQUEST_BYTES`]), `BLK_SIZE` (512), `FLUSH`, and `RO` for a
//! read-only disk. One request queue of [`QUEUE_SIZE`] entries.
//!
//! **Where requests run.** Requests are processed synchronously on the vCPU thread that
//! writes QueueNotify, inside that MMIO exit (as early Firecracker did), not on an I/O thread:
//! - the disks are raw files that live in the host page cache (the read-only system disk and
//!   image disks are read over and over), so a `preadv` into guest memory takes a few
//!   microseconds, about what handing the request to another thread through an eventfd and
//!   waking it would cost (an MMIO exit alone is ≈10 µs on an interpreting KVM host);
//! - a snapshot needs no in-flight tracking: a paused vCPU has completed its pending exit,
//!   so every notified request has been answered and the queue state alone describes the
//!   device ([`persist`]);
//! - no extra thread, eventfd or lock ordering beyond the transport's mutex.
//!
//! The cost is that a slow backing file (cold cache, network file system) stalls the
//! notifying vCPU for the duration of the request. If that shows up, an ioeventfd-driven I/O
//! thread can take over `Block::process_queue` without changing the request code.
//!
//! Everything the guest controls is checked: every descriptor walk is bounded by the queue
//! size and by `SEG_MAX + 2` descriptors, every buffer lies in guest memory, every sector
//! range is checked against the disk with checked arithmetic ([`request`]). A chain that
//! cannot be answered (no status byte, a loop, a buffer outside guest memory) marks the
//! device broken (DEVICE_NEEDS_RESET); a well-formed but invalid request fails with IOERR or
//! UNSUPP.

pub mod disk;
#[doc(hidden)]
pub mod fuzz;
pub mod persist;
pub mod request;

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};

use self::disk::Disk;
use self::request::{parse, status, Refusal, Request, RequestType, ID_BYTES, SEG_MAX, SIZE_MAX};
use super::virtio::queue::Desc;
use super::virtio::request_queue::{RequestDevice, RequestQueue};
use super::virtio::{
    read_config_bytes, ActivateError, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1,
};
use crate::exit::VmEvent;
use crate::memory::GuestMem;

/// virtio device id of a block device.
pub const BLOCK_DEVICE_ID: u32 = 2;
/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Longest descriptor chain accepted: header, [`SEG_MAX`] data segments, status.
pub const MAX_CHAIN_DESCS: usize = SEG_MAX as usize + 2;
/// Block size offered (`blk_size`).
pub const BLOCK_SIZE: u32 = 512;
/// Longest "broken" reason kept.
pub use super::virtio::MAX_BROKEN_REASON_LEN as MAX_REASON_LEN;

/// Feature bits (`VIRTIO_BLK_F_*`).
pub mod features {
    /// `size_max` is valid.
    pub const SIZE_MAX: u32 = 1;
    /// `seg_max` is valid.
    pub const SEG_MAX: u32 = 2;
    /// The disk is read-only.
    pub const RO: u32 = 5;
    /// `blk_size` is valid.
    pub const BLK_SIZE: u32 = 6;
    /// FLUSH requests are supported.
    pub const FLUSH: u32 = 9;
}

const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// The features offered for a disk.
pub fn offered_features(read_only: bool) -> u64 {
    let mut f = (1u64 << VIRTIO_F_VERSION_1)
        | (1 << features::SIZE_MAX)
        | (1 << features::SEG_MAX)
        | (1 << features::BLK_SIZE)
        | (1 << features::FLUSH);
    if read_only {
        f |= 1 << features::RO;
    }
    f
}

/// The stable GET_ID string of disk `index`: `voidbox-vda`, `voidbox-vdb`, … padded with
/// NULs (it names the slot, so a restored VM's disks keep their IDs).
pub fn disk_id(index: usize) -> [u8; ID_BYTES] {
    let mut id = [0u8; ID_BYTES];
    let name = format!("voidbox-{}", disk_name(index));
    let n = name.len().min(ID_BYTES);
    id[..n].copy_from_slice(&name.as_bytes()[..n]);
    id
}

/// The guest's name for disk `index`: `vda` … `vdz`, then `vdaa` … (Linux's scheme).
pub fn disk_name(index: usize) -> String {
    let mut suffix = Vec::new();
    let mut i = index;
    loop {
        suffix.push(b'a' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    suffix.reverse();
    format!("vd{}", String::from_utf8_lossy(&suffix))
}

/// Counters, for tests and diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockStats {
    /// Completed reads.
    pub reads: u64,
    /// Completed writes.
    pub writes: u64,
    /// Completed flushes.
    pub flushes: u64,
    /// Requests answered with a status other than OK.
    pub errors: u64,
}

/// One disk's device state, shared by the MMIO transport (which owns the [`BlockDevice`])
/// and the snapshot code.
pub struct Block {
    disk: Disk,
    index: usize,
    id: [u8; ID_BYTES],
    requests: RequestQueue,
    stats: BlockStats,
}

impl Block {
    /// Disk number `index` of the VM (`/dev/vda` is 0), raising `irq`, reporting a broken
    /// queue to `events`.
    pub fn new(
        disk: Disk,
        index: usize,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Self {
        Self {
            disk,
            index,
            id: disk_id(index),
            requests: RequestQueue::new(
                format!("block {}", disk_name(index)),
                MAX_CHAIN_DESCS,
                irq,
                events,
            ),
            stats: BlockStats::default(),
        }
    }

    /// The backing file.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Counters.
    pub fn stats(&self) -> BlockStats {
        self.stats
    }

    /// Why the device is broken, if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.requests.broken_reason()
    }

    /// True between activation and reset, unless broken.
    pub fn is_active(&self) -> bool {
        self.requests.is_active()
    }

    /// Offered features.
    pub fn features(&self) -> u64 {
        offered_features(self.disk.read_only())
    }

    /// The config space (`struct virtio_blk_config` up to `blk_size`).
    fn config_space(&self) -> [u8; 24] {
        let mut c = [0u8; 24];
        c[0..8].copy_from_slice(&self.disk.capacity().to_le_bytes());
        c[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        // 16..20: geometry (not offered).
        c[20..24].copy_from_slice(&BLOCK_SIZE.to_le_bytes());
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

    /// Device reset: forget the queue.
    pub fn reset(&mut self) {
        self.requests.reset();
    }

    /// Marks the device broken: processing stops, the driver sees DEVICE_NEEDS_RESET and a
    /// configuration-change interrupt. The VMM keeps running.
    pub fn mark_broken(&mut self, why: String) {
        self.requests.mark_broken(why);
    }

    /// Answers every available request; returns true when used buffers were added (the
    /// interrupt is then raised).
    pub fn process_queue(&mut self) -> bool {
        self.process_requests()
    }

    /// Runs one parsed request and writes its status. Returns the used length (bytes written
    /// into the chain), or why the device is broken.
    fn execute(&mut self, mem: &GuestMem, req: &Request) -> Result<u32, String> {
        let outcome = req
            .check(self.disk.capacity(), self.disk.read_only())
            .map_err(|r: Refusal| (r.status(), r.to_string()))
            .and_then(|()| self.run(mem, req));
        match outcome {
            Ok(data_written) => self.complete(mem, req.status, status::OK, data_written),
            Err((st, why)) => {
                log::debug!("block {}: request failed: {why}", disk_name(self.index));
                self.stats.errors += 1;
                self.complete(mem, req.status, st, 0)
            }
        }
    }

    /// The disk side of a checked request; returns the data bytes written into guest memory.
    fn run(&mut self, mem: &GuestMem, req: &Request) -> Result<u32, (u8, String)> {
        let ioerr = |e: std::io::Error| (status::IOERR, e.to_string());
        let offset = || {
            req.offset()
                .ok_or((status::IOERR, "sector overflows".to_string()))
        };
        match req.kind {
            RequestType::In => {
                self.disk
                    .read_to_guest(mem, &req.data, offset()?)
                    .map_err(ioerr)?;
                self.stats.reads += 1;
                u32::try_from(req.data_len).map_err(|_| (status::IOERR, "too long".into()))
            }
            RequestType::Out => {
                self.disk
                    .write_from_guest(mem, &req.data, offset()?)
                    .map_err(ioerr)?;
                self.stats.writes += 1;
                Ok(0)
            }
            RequestType::Flush => {
                self.disk.flush().map_err(ioerr)?;
                self.stats.flushes += 1;
                Ok(0)
            }
            RequestType::GetId => {
                let mut left = &self.id[..];
                let mut written = 0u32;
                for s in &req.data {
                    if left.is_empty() {
                        break;
                    }
                    let n = left.len().min(s.len as usize);
                    mem.write_slice(&left[..n], s.addr)
                        .map_err(|e| (status::IOERR, e.to_string()))?;
                    left = &left[n..];
                    written += n as u32;
                }
                Ok(written)
            }
            RequestType::Unsupported(t) => Err((status::UNSUPP, format!("request type {t}"))),
        }
    }

    /// Writes the status byte; returns the used length, or why the device is broken when the
    /// byte cannot be written.
    fn complete(&self, mem: &GuestMem, at: GuestAddress, st: u8, data: u32) -> Result<u32, String> {
        mem.write_obj(st, at)
            .map_err(|e| format!("status byte: {e}"))?;
        Ok(data.saturating_add(1))
    }
}

impl RequestDevice for Block {
    fn requests(&mut self) -> &mut RequestQueue {
        &mut self.requests
    }

    fn answer(&mut self, mem: &GuestMem, descs: &[Desc]) -> Result<u32, String> {
        match parse(mem, descs) {
            Ok(req) => self.execute(mem, &req),
            Err(e) => match e.status {
                Some(at) => {
                    log::debug!("block {}: bad request: {}", disk_name(self.index), e.error);
                    self.stats.errors += 1;
                    self.complete(mem, at, status::IOERR, 0)
                }
                None => Err(format!("request queue: {}", e.error)),
            },
        }
    }
}

/// Locks a block device, recovering from a poisoned lock (state stays consistent per call).
pub fn lock(b: &Mutex<Block>) -> MutexGuard<'_, Block> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

/// The virtio side of a block device, owned by the MMIO transport.
pub struct BlockDevice {
    block: Arc<Mutex<Block>>,
    features: u64,
}

impl BlockDevice {
    /// A device around `block`.
    pub fn new(block: Arc<Mutex<Block>>) -> Self {
        let features = lock(&block).features();
        Self { block, features }
    }
}

impl VirtioDevice for BlockDevice {
    fn name(&self) -> &'static str {
        "block"
    }

    fn device_type(&self) -> u32 {
        BLOCK_DEVICE_ID
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = lock(&self.block).config_space();
        read_config_bytes(&cfg, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        log::debug!("block: guest wrote read-only config space");
    }

    fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        lock(&self.block).activate(mem, queues, acked_features)
    }

    fn queue_notify(&mut self, _index: u32) {
        lock(&self.block).process_queue();
    }

    fn reset(&mut self) {
        lock(&self.block).reset();
    }

    fn is_broken(&self) -> bool {
        lock(&self.block).requests.is_broken()
    }
}

#[cfg(test)]
mod tests;
