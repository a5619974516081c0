//! Identity-mapped page tables for the first GiB (2 MiB pages), enough for `startup_64`.

use vm_memory::{Bytes, GuestAddress};

use super::{BootError, PDE_START, PDPTE_START, PML4_START};
use crate::memory::GuestMem;

const PRESENT_RW: u64 = 0x3;
const PAGE_SIZE_2M: u64 = 0x80;

/// Writes PML4 → PDPT → PD (512 × 2 MiB) and returns the CR3 value.
pub fn setup_identity_map(mem: &GuestMem) -> Result<u64, BootError> {
    mem.write_obj(PDPTE_START | PRESENT_RW, GuestAddress(PML4_START))
        .map_err(|_| BootError::PageTables)?;
    mem.write_obj(PDE_START | PRESENT_RW, GuestAddress(PDPTE_START))
        .map_err(|_| BootError::PageTables)?;
    let mut pd = [0u8; 4096];
    for (i, chunk) in pd.chunks_exact_mut(8).enumerate() {
        let entry = ((i as u64) << 21) | PRESENT_RW | PAGE_SIZE_2M;
        chunk.copy_from_slice(&entry.to_le_bytes());
    }
    mem.write_slice(&pd, GuestAddress(PDE_START))
        .map_err(|_| BootError::PageTables)?;
    Ok(PML4_START)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    #[test]
    fn identity_map_layout() {
        let mem = create_guest_memory(32 << 20).unwrap();
        let cr3 = setup_identity_map(&mem).unwrap();
        assert_eq!(cr3, PML4_START);
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_eq!(pml4, PDPTE_START | 3);
        let pdpte: u64 = mem.read_obj(GuestAddress(PDPTE_START)).unwrap();
        assert_eq!(pdpte, PDE_START | 3);
        let pde5: u64 = mem.read_obj(GuestAddress(PDE_START + 5 * 8)).unwrap();
        assert_eq!(pde5, (5 << 21) | 0x83);
    }
}
