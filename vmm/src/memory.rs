//! Guest memory: one anonymous region at guest-physical 0, below the 32-bit MMIO gap.

use vm_memory::{GuestAddress, GuestMemoryMmap};

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
}
