//! Guest memory, PC layout: RAM from guest-physical 0 up to the 32-bit MMIO gap
//! ([`MMIO_GAP_START`], 3 GiB), and whatever does not fit there in a second region from
//! 4 GiB up ([`HIGH_RAM_START`]); see [`ram_regions`]. Anonymous (`MAP_NORESERVE`, so host
//! memory is used only as the guest touches it) on a cold boot, a private (copy-on-write)
//! mapping of the snapshot's memory file on restore; for a layered snapshot, the base's
//! memory file with the diff's page runs mapped over it ([`overlay_file_runs`]).

use std::fs::File;
use std::os::unix::io::AsRawFd;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MemoryRegionAddress,
};

/// Start of the 32-bit MMIO gap: the low RAM region ends here at the latest.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO gap: RAM beyond [`MMIO_GAP_START`] continues here.
pub const HIGH_RAM_START: u64 = 1 << 32;
/// Largest guest memory [`ram_regions`] lays out (the config's maximum).
pub const MAX_GUEST_MEMORY: u64 = (crate::config::MAX_MEMORY_MB as u64) << 20;
/// First virtio-mmio device window (4 KiB each).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Size of one virtio-mmio register window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// First legacy IRQ handed to virtio devices (4 is the serial port).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// Highest IOAPIC pin usable for devices.
pub const IRQ_MAX: u32 = 23;
/// Local APIC MMIO base.
pub const APIC_DEFAULT_BASE: u64 = 0xfee0_0000;
/// IOAPIC MMIO base.
pub const IOAPIC_DEFAULT_BASE: u64 = 0xfec0_0000;
/// KVM's TSS (three pages) just below the 4 GiB boundary, outside RAM.
pub const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

/// Guest memory type used throughout the VMM.
pub type GuestMem = GuestMemoryMmap<()>;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Requested size is zero, not page-aligned or above [`MAX_GUEST_MEMORY`].
    #[error("guest memory of {0} bytes is not a page multiple within 4 KiB..={MAX_GUEST_MEMORY}")]
    BadSize(u64),
    /// mmap failed.
    #[error("cannot map guest memory: {0}")]
    Mmap(String),
}

/// One guest RAM region: `size` bytes at guest-physical `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRegion {
    /// Guest-physical start.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
}

impl RamRegion {
    /// First guest-physical address after the region.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// The RAM regions of a guest with `size` bytes of memory, in guest-physical order: one
/// region `[0, size)` when it fits below the MMIO gap, else `[0, MMIO_GAP_START)` and
/// `[HIGH_RAM_START, HIGH_RAM_START + size - MMIO_GAP_START)`. A snapshot's memory file holds
/// them back to back in this order.
pub fn ram_regions(size: u64) -> Result<Vec<RamRegion>, MemoryError> {
    if size == 0 || !size.is_multiple_of(4096) || size > MAX_GUEST_MEMORY {
        return Err(MemoryError::BadSize(size));
    }
    if size <= MMIO_GAP_START {
        return Ok(vec![RamRegion { start: 0, size }]);
    }
    Ok(vec![
        RamRegion {
            start: 0,
            size: MMIO_GAP_START,
        },
        RamRegion {
            start: HIGH_RAM_START,
            size: size - MMIO_GAP_START,
        },
    ])
}

/// Total RAM of `mem` (the sum of its regions, not its highest address).
pub fn ram_size(mem: &GuestMem) -> u64 {
    mem.iter().map(|r| r.len()).sum()
}

/// End of the RAM region that starts at guest-physical 0 (where boot structures, kernel and
/// initramfs must live).
pub fn low_ram_end(mem: &GuestMem) -> u64 {
    mem.iter()
        .find(|r| r.start_addr().0 == 0)
        .map_or(0, |r| r.len())
}

fn len_of(r: &RamRegion) -> Result<usize, MemoryError> {
    usize::try_from(r.size).map_err(|_| MemoryError::BadSize(r.size))
}

/// Allocates `size` bytes of guest RAM laid out by [`ram_regions`] (anonymous,
/// `MAP_NORESERVE`: untouched guest pages cost no host memory).
pub fn create_guest_memory(size: u64) -> Result<GuestMem, MemoryError> {
    let ranges = ram_regions(size)?
        .iter()
        .map(|r| Ok((GuestAddress(r.start), len_of(r)?)))
        .collect::<Result<Vec<_>, MemoryError>>()?;
    GuestMemoryMmap::from_ranges(&ranges).map_err(|e| MemoryError::Mmap(e.to_string()))
}

/// Maps `file` (exactly `size` bytes, checked by the caller) as guest RAM laid out by
/// [`ram_regions`], each region at its offset in the file (the regions back to back),
/// `MAP_PRIVATE | MAP_NORESERVE`: pages are read lazily from the file and copied on the
/// guest's first write; the file itself is never modified. `file` may be opened read-only.
pub fn map_guest_memory_file(file: File, size: u64) -> Result<GuestMem, MemoryError> {
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for r in ram_regions(size)? {
        let f = file
            .try_clone()
            .map_err(|e| MemoryError::Mmap(e.to_string()))?;
        let region = MmapRegionBuilder::new(len_of(&r)?)
            .with_file_offset(FileOffset::new(f, offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| MemoryError::Mmap(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(r.start))
            .ok_or_else(|| MemoryError::Mmap("guest region overflows".into()))?;
        regions.push(region);
        offset += r.size;
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Mmap(e.to_string()))
}

/// Maps runs of `file` over guest memory laid out by [`ram_regions`] (as [`map_guest_memory_file`]
/// mapped it): each `(memory-file offset, length, offset in file)` replaces that range of
/// guest RAM with a private (copy-on-write, lazily read) mapping of `file`, `MAP_FIXED` in
/// place. Every offset and length must be page-aligned and each run inside one RAM region;
/// the caller verified `file` is long enough. The runs stay part of `mem`'s regions (their
/// unmapping on drop covers them).
pub fn overlay_file_runs(
    mem: &GuestMem,
    file: &File,
    runs: &[(u64, u64, u64)],
) -> Result<(), MemoryError> {
    const PAGE: u64 = 4096;
    let mut layout = Vec::new();
    let mut at = 0u64;
    for r in ram_regions(ram_size(mem))? {
        layout.push((at, r));
        at += r.size;
    }
    for &(off, len, file_off) in runs {
        let bad = |why: &str| {
            MemoryError::Mmap(format!(
                "overlay of {len:#x} bytes at memory offset {off:#x} (file offset {file_off:#x}): {why}"
            ))
        };
        if len == 0
            || !off.is_multiple_of(PAGE)
            || !len.is_multiple_of(PAGE)
            || !file_off.is_multiple_of(PAGE)
        {
            return Err(bad("not page-aligned"));
        }
        let (start, r) = layout
            .iter()
            .find(|(s, r)| off >= *s && off.checked_add(len).is_some_and(|e| e <= s + r.size))
            .ok_or_else(|| bad("not inside one RAM region"))?;
        let gpa = r.start + (off - start);
        let region = mem
            .find_region(GuestAddress(gpa))
            .ok_or_else(|| bad("not in guest memory"))?;
        let rel = gpa - region.start_addr().0;
        if rel + len > region.len() {
            return Err(bad("crosses the end of its guest memory region"));
        }
        let host = region
            .get_host_address(MemoryRegionAddress(rel))
            .map_err(|e| bad(&e.to_string()))?;
        let n = usize::try_from(len).map_err(|_| bad("too long"))?;
        let fo = libc::off_t::try_from(file_off).map_err(|_| bad("file offset too large"))?;
        // SAFETY: `[host, host + n)` lies inside a mapping owned by `mem` (checked above:
        // within one region, page-aligned), which nothing else references while the VM is
        // being built; MAP_FIXED replaces exactly those pages with a private mapping of
        // `file` with the same protection, and the region's unmap on drop covers them.
        let p = unsafe {
            libc::mmap(
                host.cast(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                fo,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(bad(&std::io::Error::last_os_error().to_string()));
        }
        if p != host.cast() {
            return Err(bad("mapped at the wrong address"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn pairs(size: u64) -> Vec<(u64, u64)> {
        ram_regions(size)
            .unwrap()
            .iter()
            .map(|r| (r.start, r.size))
            .collect()
    }

    #[test]
    fn layout_splits_at_the_mmio_gap() {
        assert_eq!(pairs(128 * MIB), [(0, 128 * MIB)]);
        assert_eq!(pairs(3 * GIB), [(0, 3 * GIB)]);
        assert_eq!(pairs(4 * GIB), [(0, 3 * GIB), (4 * GIB, GIB)]);
        assert_eq!(pairs(16 * GIB), [(0, 3 * GIB), (4 * GIB, 13 * GIB)]);
        assert_eq!(
            pairs(MAX_GUEST_MEMORY),
            [(0, 3 * GIB), (4 * GIB, MAX_GUEST_MEMORY - 3 * GIB)]
        );
        for size in [128 * MIB, 3 * GIB, 3 * GIB + 4096, 4 * GIB, 16 * GIB] {
            let r = ram_regions(size).unwrap();
            assert_eq!(r.iter().map(|r| r.size).sum::<u64>(), size);
            // Nothing in the gap: not the virtio windows, the IOAPIC, the LAPIC, KVM's TSS.
            for reg in &r {
                for dev in [
                    VIRTIO_MMIO_BASE,
                    IOAPIC_DEFAULT_BASE,
                    APIC_DEFAULT_BASE,
                    KVM_TSS_ADDRESS as u64,
                ] {
                    assert!(!(reg.start..reg.end()).contains(&dev), "{dev:#x} in RAM");
                }
            }
        }
        for bad in [0, 4095, MAX_GUEST_MEMORY + 4096] {
            assert!(ram_regions(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn large_guest_memory_is_two_lazy_regions() {
        fn rss() -> u64 {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        }
        let before = rss();
        let m = create_guest_memory(16 * GIB).unwrap();
        assert_eq!(m.num_regions(), 2);
        assert_eq!(ram_size(&m), 16 * GIB);
        assert_eq!(low_ram_end(&m), 3 * GIB);
        assert_eq!(m.last_addr(), GuestAddress(17 * GIB - 1));
        m.write_obj(0x5a5a_u16, GuestAddress(4 * GIB + 0x1000))
            .unwrap();
        m.write_obj(0xa5_u8, GuestAddress(17 * GIB - 1)).unwrap();
        assert_eq!(
            m.read_obj::<u16>(GuestAddress(4 * GIB + 0x1000)).unwrap(),
            0x5a5a
        );
        // The gap is not memory.
        assert!(m.read_obj::<u8>(GuestAddress(3 * GIB)).is_err());
        assert!(m.read_obj::<u8>(GuestAddress(0xd000_0000)).is_err());
        // Mapped lazily: a 16 GiB guest costs only the pages it touched.
        assert!(rss() < before + 64 * MIB, "{} -> {}", before, rss());
    }

    #[test]
    fn file_mapping_places_the_high_region_after_the_low_one() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mem");
        let f = File::create(&p).unwrap();
        f.set_len(4 * GIB).unwrap();
        f.write_all_at(b"low end", 3 * GIB - 7).unwrap();
        f.write_all_at(b"high", 3 * GIB).unwrap();
        drop(f);
        let m = map_guest_memory_file(File::open(&p).unwrap(), 4 * GIB).unwrap();
        let mut b = [0u8; 7];
        m.read_slice(&mut b, GuestAddress(3 * GIB - 7)).unwrap();
        assert_eq!(&b, b"low end");
        m.read_slice(&mut b[..4], GuestAddress(4 * GIB)).unwrap();
        assert_eq!(&b[..4], b"high");
    }

    #[test]
    fn sizes() {
        let m = create_guest_memory(16 << 20).unwrap();
        assert_eq!(m.last_addr(), GuestAddress((16 << 20) - 1));
        assert!(create_guest_memory(0).is_err());
        assert!(create_guest_memory(4095).is_err());
        assert!(create_guest_memory(MAX_GUEST_MEMORY + 4096).is_err());
    }

    #[test]
    fn file_mapping_is_private() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mem");
        let mut f = File::create(&p).unwrap();
        f.write_all(b"from file").unwrap();
        f.set_len(1 << 20).unwrap();
        drop(f);
        let m = map_guest_memory_file(File::open(&p).unwrap(), 1 << 20).unwrap();
        let mut b = [0u8; 9];
        m.read_slice(&mut b, GuestAddress(0)).unwrap();
        assert_eq!(&b, b"from file");
        m.write_slice(b"guest", GuestAddress(0)).unwrap();
        m.write_slice(b"tail", GuestAddress((1 << 20) - 4)).unwrap();
        m.read_slice(&mut b[..5], GuestAddress(0)).unwrap();
        assert_eq!(&b[..5], b"guest");
        // The file is untouched.
        let on_disk = std::fs::read(&p).unwrap();
        assert_eq!(&on_disk[..9], b"from file");
        assert_eq!(&on_disk[(1 << 20) - 4..], &[0; 4]);
        assert!(map_guest_memory_file(File::open(&p).unwrap(), 0).is_err());
    }
}
