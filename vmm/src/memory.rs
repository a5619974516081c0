//! Guest memory: one region at guest-physical 0, below the 32-bit MMIO gap; anonymous on a
//! cold boot, a private (copy-on-write) mapping of the snapshot's memory file on restore.

use std::fs::File;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Start of the 32-bit MMIO gap; guest RAM must end at or below it.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
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
    /// Requested size does not fit below the MMIO gap.
    #[error("guest memory of {0} bytes does not fit below the 32-bit MMIO gap")]
    TooLarge(u64),
    /// mmap failed.
    #[error("cannot map guest memory: {0}")]
    Mmap(String),
}

/// Allocates `size` bytes of guest RAM starting at guest-physical address 0.
pub fn create_guest_memory(size: u64) -> Result<GuestMem, MemoryError> {
    if size == 0 || size > MMIO_GAP_START {
        return Err(MemoryError::TooLarge(size));
    }
    let len = usize::try_from(size).map_err(|_| MemoryError::TooLarge(size))?;
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), len)])
        .map_err(|e| MemoryError::Mmap(e.to_string()))
}

/// Maps `file` (exactly `size` bytes, checked by the caller) as guest RAM at guest-physical 0,
/// `MAP_PRIVATE | MAP_NORESERVE`: pages are read lazily from the file and copied on the
/// guest's first write; the file itself is never modified. `file` may be opened read-only.
pub fn map_guest_memory_file(file: File, size: u64) -> Result<GuestMem, MemoryError> {
    if size == 0 || size > MMIO_GAP_START {
        return Err(MemoryError::TooLarge(size));
    }
    let len = usize::try_from(size).map_err(|_| MemoryError::TooLarge(size))?;
    let region = MmapRegionBuilder::new(len)
        .with_file_offset(FileOffset::new(file, 0))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
        .build()
        .map_err(|e| MemoryError::Mmap(e.to_string()))?;
    let region = GuestRegionMmap::new(region, GuestAddress(0))
        .ok_or_else(|| MemoryError::Mmap("guest region overflows".into()))?;
    GuestMemoryMmap::from_regions(vec![region]).map_err(|e| MemoryError::Mmap(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn sizes() {
        let m = create_guest_memory(16 << 20).unwrap();
        assert_eq!(m.last_addr(), GuestAddress((16 << 20) - 1));
        assert!(create_guest_memory(MMIO_GAP_START + 4096).is_err());
        assert!(create_guest_memory(0).is_err());
    }

    #[test]
    fn file_mapping_is_private() {
        use std::io::Write;
        use vm_memory::Bytes;
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
