//! The `block_request` fuzz target's entry point ([`fuzz_requests`]), also replayed over the
//! seed corpus by `tests/fuzz_corpus.rs`. Not part of the VMM's interface.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::disk::Disk;
use super::{Block, BlockStats, QUEUE_SIZE};
use crate::devices::virtio::Interrupt;
use crate::memory::GuestMem;

/// What [`fuzz_requests`] observed, for corpus tests.
#[doc(hidden)]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FuzzReport {
    /// Status byte of each answered request, in used-ring order.
    pub statuses: Vec<u8>,
    /// The device was marked broken.
    pub broken: bool,
    /// Counters.
    pub stats: BlockStats,
    /// The disk's contents afterwards.
    pub disk: Vec<u8>,
}

/// Size of the disk [`fuzz_requests`] runs against (64 sectors).
#[doc(hidden)]
pub const FUZZ_DISK_BYTES: usize = 64 * 512;
/// Guest memory of [`fuzz_requests`].
#[doc(hidden)]
pub const FUZZ_MEM_BYTES: usize = 0x1_0000;
/// Queue layout of [`fuzz_requests`]: size, descriptor table, available ring, used ring.
#[doc(hidden)]
pub const FUZZ_QUEUE: (u16, u64, u64, u64) = (16, 0x0, 0x100, 0x200);

/// The byte at offset `i` of the fuzz disk before any request.
#[doc(hidden)]
pub fn fuzz_disk_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Fuzzing entry point: `data[0]` bit 0 makes the disk read-only; `data[1..]` is guest
/// memory from address 0 ([`FUZZ_MEM_BYTES`]), holding a queue laid out as [`FUZZ_QUEUE`]
/// (descriptors, rings, headers, buffers). Processes the queue twice against a
/// [`FUZZ_DISK_BYTES`] in-memory disk (memfd) and reports what happened. Must never panic.
#[doc(hidden)]
pub fn fuzz_requests(data: &[u8]) -> Option<FuzzReport> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::FromRawFd;
    use vmm_sys_util::eventfd::EventFd;

    let (&flags, image) = data.split_first()?;
    let read_only = flags & 1 != 0;
    let mem = crate::memory::create_guest_memory(FUZZ_MEM_BYTES as u64).ok()?;
    let n = image.len().min(FUZZ_MEM_BYTES);
    mem.write_slice(&image[..n], GuestAddress(0)).ok()?;

    // SAFETY: memfd_create with a static NUL-terminated name; the returned descriptor is
    // checked and then owned by the File alone.
    let fd = unsafe { libc::memfd_create(c"voidbox-fuzz-disk".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let content: Vec<u8> = (0..FUZZ_DISK_BYTES).map(fuzz_disk_byte).collect();
    file.write_all(&content).ok()?;
    let disk = Disk::from_file(
        file.try_clone().ok()?,
        std::path::Path::new("fuzz"),
        read_only,
    )
    .ok()?;

    let irq = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).ok()?));
    let mut block = Block::new(disk, 0, irq, None);
    let (size, desc, avail, used) = FUZZ_QUEUE;
    let mut q = Queue::new(QUEUE_SIZE).ok()?;
    q.set_size(size);
    q.set_desc_table_address(Some(desc as u32), Some(0));
    q.set_avail_ring_address(Some(avail as u32), Some(0));
    q.set_used_ring_address(Some(used as u32), Some(0));
    q.set_ready(true);
    let features = block.features();
    block.activate(mem.clone(), vec![q], features).ok()?;
    block.process_queue();
    block.process_queue();

    // Read back the statuses the device wrote, in used-ring order.
    let mut report = FuzzReport {
        broken: block.broken_reason().is_some(),
        stats: block.stats(),
        ..FuzzReport::default()
    };
    let used_idx: u16 = mem.read_obj(GuestAddress(used + 2)).ok()?;
    for i in 0..used_idx.min(size) {
        let elem = GuestAddress(used + 4 + 8 * u64::from(i));
        let id: u32 = mem.read_obj(elem).ok()?;
        let Ok(id) = u16::try_from(id) else { continue };
        // The status is the last writable byte of the chain headed by `id`.
        if let Some(st) = fuzz_status_of(&mem, desc, size, id) {
            report.statuses.push(st);
        }
    }
    let mut disk = vec![0u8; FUZZ_DISK_BYTES];
    file.read_exact_at(&mut disk, 0).ok()?;
    report.disk = disk;
    Some(report)
}

/// The status byte of the chain headed by `head` (last byte of its last non-empty writable
/// descriptor), walking at most `size` descriptors.
fn fuzz_status_of(mem: &GuestMem, table: u64, size: u16, head: u16) -> Option<u8> {
    let mut idx = head;
    let mut status_at = None;
    for _ in 0..size {
        let a = table + 16 * u64::from(idx);
        let addr: u64 = mem.read_obj(GuestAddress(a)).ok()?;
        let len: u32 = mem.read_obj(GuestAddress(a + 8)).ok()?;
        let flags: u16 = mem.read_obj(GuestAddress(a + 12)).ok()?;
        let next: u16 = mem.read_obj(GuestAddress(a + 14)).ok()?;
        if flags & 2 != 0 && len > 0 {
            status_at = addr.checked_add(u64::from(len) - 1);
        }
        if flags & 1 == 0 || next >= size {
            break;
        }
        idx = next;
    }
    mem.read_obj(GuestAddress(status_at?)).ok()
}
