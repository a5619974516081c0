//! The Linux "zero page" (`struct boot_params`) with the e820 memory map.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::{BootError, CMDLINE_START, HIMEM_START, RESTORE_PAGE_START};
use crate::memory::ram_regions;

/// e820 type for usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type for reserved ranges.
pub const E820_RESERVED: u32 = 2;

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;

/// Inputs of the zero page.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootParamsInput {
    /// Guest RAM size in bytes, laid out by [`crate::memory::ram_regions`] (below the MMIO
    /// gap, the rest from 4 GiB up).
    pub mem_size: u64,
    /// Command-line length in bytes, without the terminating NUL.
    pub cmdline_len: u32,
    /// Initramfs `(address, size)`, if any.
    pub initrd: Option<(u64, u64)>,
    /// The bzImage setup header, when booting a bzImage.
    pub setup_header: Option<setup_header>,
}

/// Builds `boot_params` for the 64-bit boot protocol.
pub fn build_boot_params(input: &BootParamsInput) -> Result<boot_params, BootError> {
    if input.mem_size <= HIMEM_START {
        return Err(BootError::MemoryTooSmall);
    }
    let mut params = boot_params::default();
    if let Some(hdr) = input.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = u32::try_from(CMDLINE_START).map_err(|_| BootError::Cmdline)?;
    params.hdr.cmdline_size = input.cmdline_len;
    params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
    if let Some((addr, size)) = input.initrd {
        params.hdr.ramdisk_image = u32::try_from(addr).map_err(|_| BootError::Initramfs)?;
        params.hdr.ramdisk_size = u32::try_from(size).map_err(|_| BootError::Initramfs)?;
    }
    let regions = ram_regions(input.mem_size).map_err(|_| BootError::MemoryTooSmall)?;
    // Base memory up to the restore page is RAM; the restore page, the EBDA (MP table) and
    // the legacy hole up to 1 MiB are reserved.
    add_e820(&mut params, 0, RESTORE_PAGE_START, E820_RAM)?;
    add_e820(
        &mut params,
        RESTORE_PAGE_START,
        HIMEM_START - RESTORE_PAGE_START,
        E820_RESERVED,
    )?;
    for r in regions {
        // The low region's first MiB is described above.
        let start = r.start.max(HIMEM_START);
        add_e820(&mut params, start, r.end() - start, E820_RAM)?;
    }
    Ok(params)
}

fn add_e820(params: &mut boot_params, addr: u64, size: u64, ty: u32) -> Result<(), BootError> {
    let idx = usize::from(params.e820_entries);
    let slot = params.e820_table.get_mut(idx).ok_or(BootError::E820Full)?;
    *slot = boot_e820_entry {
        addr,
        size,
        r#type: ty,
    };
    params.e820_entries += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_and_header() {
        let p = build_boot_params(&BootParamsInput {
            mem_size: 256 << 20,
            cmdline_len: 42,
            initrd: Some((0x0f00_0000, 0x10_0000)),
            setup_header: None,
        })
        .unwrap();
        assert_eq!(p.e820_entries, 3);
        let e = p.e820_table;
        let (a0, s0, t0) = (e[0].addr, e[0].size, e[0].r#type);
        assert_eq!((a0, s0, t0), (0, RESTORE_PAGE_START, E820_RAM));
        let (a1, t1) = (e[1].addr, e[1].r#type);
        assert_eq!((a1, t1), (RESTORE_PAGE_START, E820_RESERVED));
        let (a2, s2, t2) = (e[2].addr, e[2].size, e[2].r#type);
        assert_eq!(
            (a2, s2, t2),
            (HIMEM_START, (256 << 20) - HIMEM_START, E820_RAM)
        );
        let hdr = p.hdr;
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!({ hdr.type_of_loader }, 0xff);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ hdr.cmdline_size }, 42);
        assert_eq!({ hdr.ramdisk_image }, 0x0f00_0000);
        assert_eq!({ hdr.ramdisk_size }, 0x10_0000);
    }

    #[test]
    fn ranges_do_not_overlap_and_cover_ram() {
        let mem = 64u64 << 20;
        let p = build_boot_params(&BootParamsInput {
            mem_size: mem,
            ..Default::default()
        })
        .unwrap();
        let n = usize::from(p.e820_entries);
        let mut prev_end = 0;
        let mut ram = 0;
        for e in &p.e820_table[..n] {
            let (a, s, t) = (e.addr, e.size, e.r#type);
            assert!(a >= prev_end, "overlap at {a:#x}");
            prev_end = a + s;
            if t == E820_RAM {
                ram += s;
            }
        }
        assert!(prev_end <= mem);
        assert_eq!(ram, mem - (HIMEM_START - RESTORE_PAGE_START));
    }

    fn e820(mem_size: u64) -> Vec<(u64, u64, u32)> {
        let p = build_boot_params(&BootParamsInput {
            mem_size,
            ..Default::default()
        })
        .unwrap();
        p.e820_table[..usize::from(p.e820_entries)]
            .iter()
            .map(|e| (e.addr, e.size, e.r#type))
            .collect()
    }

    #[test]
    fn e820_for_small_and_large_guests() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let base = [
            (0, RESTORE_PAGE_START, E820_RAM),
            (
                RESTORE_PAGE_START,
                HIMEM_START - RESTORE_PAGE_START,
                E820_RESERVED,
            ),
        ];
        let with = |rest: &[(u64, u64, u32)]| [&base[..], rest].concat();
        assert_eq!(
            e820(128 * MIB),
            with(&[(HIMEM_START, 128 * MIB - HIMEM_START, E820_RAM)])
        );
        assert_eq!(
            e820(3 * GIB),
            with(&[(HIMEM_START, 3 * GIB - HIMEM_START, E820_RAM)])
        );
        let low = (HIMEM_START, 3 * GIB - HIMEM_START, E820_RAM);
        assert_eq!(e820(4 * GIB), with(&[low, (4 * GIB, GIB, E820_RAM)]));
        assert_eq!(e820(16 * GIB), with(&[low, (4 * GIB, 13 * GIB, E820_RAM)]));
        // Usable RAM is the guest's size less the reserved EBDA/BIOS hole, and nothing is
        // usable inside the 32-bit MMIO gap.
        for size in [128 * MIB, 3 * GIB, 4 * GIB, 16 * GIB] {
            let e = e820(size);
            let ram: u64 = e.iter().filter(|x| x.2 == E820_RAM).map(|x| x.1).sum();
            assert_eq!(ram, size - (HIMEM_START - RESTORE_PAGE_START));
            for (a, s, _) in e {
                assert!(a + s <= 3 * GIB || a >= 4 * GIB, "{a:#x}+{s:#x} in the gap");
            }
        }
        // Not a valid guest size.
        assert!(build_boot_params(&BootParamsInput {
            mem_size: crate::memory::MAX_GUEST_MEMORY + 4096,
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn tiny_memory_rejected() {
        assert!(build_boot_params(&BootParamsInput {
            mem_size: 0x8_0000,
            ..Default::default()
        })
        .is_err());
    }
}
