//! Intel MultiProcessor Specification 1.4 table: lets the guest find its vCPUs, the ISA bus
//! and the IOAPIC without ACPI. Built into a byte buffer (checksummed) and written to the
//! last KiB of base memory, which Linux scans.

use vm_memory::{Bytes, GuestAddress};

use super::{BootError, MPTABLE_START};
use crate::memory::{GuestMem, APIC_DEFAULT_BASE, IOAPIC_DEFAULT_BASE, IRQ_MAX};

/// Space reserved for the table (`[0x9fc00, 0xa0000)`).
pub const MPTABLE_MAX_SIZE: usize = 0x400;

const SPEC_REV: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
const CPU_STEPPING: u32 = 0x600;
const CPU_FEATURE_APIC: u32 = 0x200;
const CPU_FEATURE_FPU: u32 = 0x001;
const MPC_APIC_USABLE: u8 = 1;
const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;
const MP_INT: u8 = 0;
const MP_NMI: u8 = 1;
const MP_EXTINT: u8 = 3;
const BUS_ID_ISA: u8 = 0;
const FLOATING_LEN: usize = 16;
const HEADER_LEN: usize = 44;

/// Sum of bytes modulo 256 (a valid MP structure sums to zero).
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b))
}

/// The IOAPIC id used in the table (after the CPUs' APIC ids `0..num_cpus`).
pub fn ioapic_id(num_cpus: u8) -> u8 {
    num_cpus.saturating_add(1)
}

/// Builds the floating pointer + configuration table for `num_cpus` CPUs, to be placed at
/// guest-physical `base`.
pub fn build_mptable(num_cpus: u8, base: u64) -> Result<Vec<u8>, BootError> {
    if num_cpus == 0 || num_cpus > 254 {
        return Err(BootError::MpTable("bad CPU count"));
    }
    let table_addr =
        u32::try_from(base + FLOATING_LEN as u64).map_err(|_| BootError::MpTable("address"))?;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..num_cpus {
        entries.extend_from_slice(&[MP_PROCESSOR, cpu, APIC_VERSION]);
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOTPROCESSOR } else { 0 };
        entries.push(flags);
        entries.extend_from_slice(&CPU_STEPPING.to_le_bytes());
        entries.extend_from_slice(&(CPU_FEATURE_APIC | CPU_FEATURE_FPU).to_le_bytes());
        entries.extend_from_slice(&[0u8; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[MP_BUS, BUS_ID_ISA]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    let ioapic = ioapic_id(num_cpus);
    entries.extend_from_slice(&[MP_IOAPIC, ioapic, APIC_VERSION, MPC_APIC_USABLE]);
    entries.extend_from_slice(&(IOAPIC_DEFAULT_BASE as u32).to_le_bytes());
    count += 1;
    for irq in 0..=IRQ_MAX as u8 {
        // Type, irqtype, irqflag (conforms to bus), source bus, source irq, dest apic, pin.
        entries.extend_from_slice(&[MP_INTSRC, MP_INT, 0, 0, BUS_ID_ISA, irq, ioapic, irq]);
        count += 1;
    }
    // ExtINT → LINT0 of the BSP, NMI → LINT1 of every local APIC.
    entries.extend_from_slice(&[MP_LINTSRC, MP_EXTINT, 0, 0, BUS_ID_ISA, 0, 0, 0]);
    entries.extend_from_slice(&[MP_LINTSRC, MP_NMI, 0, 0, BUS_ID_ISA, 0, 0xff, 1]);
    count += 2;

    let table_len = HEADER_LEN + entries.len();
    if FLOATING_LEN + table_len > MPTABLE_MAX_SIZE {
        return Err(BootError::MpTable("too many CPUs for the reserved area"));
    }
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(table_len as u16).to_le_bytes());
    table.push(SPEC_REV);
    table.push(0); // checksum, patched below
    table.extend_from_slice(b"VOIDBOX ");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(APIC_DEFAULT_BASE as u32).to_le_bytes());
    table.extend_from_slice(&0u32.to_le_bytes()); // extended table length/checksum
    debug_assert_eq!(table.len(), HEADER_LEN);
    table.extend_from_slice(&entries);
    table[7] = 0u8.wrapping_sub(checksum(&table));

    let mut fp = Vec::with_capacity(FLOATING_LEN);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&table_addr.to_le_bytes());
    fp.push(1); // length in 16-byte units
    fp.push(SPEC_REV);
    fp.push(0); // checksum
    fp.extend_from_slice(&[0u8; 5]); // feature bytes: config table present, no IMCR
    fp[10] = 0u8.wrapping_sub(checksum(&fp));

    fp.extend_from_slice(&table);
    Ok(fp)
}

/// Writes the MP table for `num_cpus` CPUs at [`MPTABLE_START`].
pub fn setup_mptable(mem: &GuestMem, num_cpus: u8) -> Result<(), BootError> {
    let bytes = build_mptable(num_cpus, MPTABLE_START)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|_| BootError::MpTable("table does not fit in guest memory"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    #[test]
    fn checksums_are_zero() {
        for cpus in [1u8, 2, 16, crate::config::MAX_VCPUS] {
            let t = build_mptable(cpus, MPTABLE_START).unwrap();
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(checksum(&t[..16]), 0, "floating pointer checksum");
            let table = &t[16..];
            assert_eq!(&table[0..4], b"PCMP");
            let len = u16::from_le_bytes([table[4], table[5]]) as usize;
            assert_eq!(len, table.len());
            assert_eq!(checksum(table), 0, "config table checksum");
            let count = u16::from_le_bytes([table[34], table[35]]);
            assert_eq!(count as usize, cpus as usize + 1 + 1 + 24 + 2);
            let ptr = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
            assert_eq!(u64::from(ptr), MPTABLE_START + 16);
        }
    }

    #[test]
    fn cpu_entries() {
        let t = build_mptable(2, MPTABLE_START).unwrap();
        let e = &t[16 + HEADER_LEN..];
        assert_eq!(e[0], MP_PROCESSOR);
        assert_eq!(e[1], 0);
        assert_eq!(e[3], CPU_ENABLED | CPU_BOOTPROCESSOR);
        assert_eq!(e[20], MP_PROCESSOR);
        assert_eq!(e[21], 1);
        assert_eq!(e[23], CPU_ENABLED);
        // IOAPIC entry after the bus.
        assert_eq!(e[48], MP_IOAPIC);
        assert_eq!(e[49], ioapic_id(2));
    }

    #[test]
    fn limits() {
        assert!(build_mptable(0, MPTABLE_START).is_err());
        assert!(build_mptable(40, MPTABLE_START).is_err());
        let mem = create_guest_memory(32 << 20).unwrap();
        setup_mptable(&mem, crate::config::MAX_VCPUS).unwrap();
        let tiny = create_guest_memory(0x9f000).unwrap();
        assert!(setup_mptable(&tiny, 1).is_err());
    }
}
