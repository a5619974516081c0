//! The Linux "zero page" (`struct boot_params`) with the e820 memory map.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::{BootError, CMDLINE_START, EBDA_START, HIMEM_START};

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
    /// Guest RAM size in bytes (RAM is `[0, mem_size)`).
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
    add_e820(&mut params, 0, EBDA_START, E820_RAM)?;
    add_e820(
        &mut params,
        EBDA_START,
        0x10_0000 - EBDA_START,
        E820_RESERVED,
    )?;
    add_e820(
        &mut params,
        HIMEM_START,
        input.mem_size - HIMEM_START,
        E820_RAM,
    )?;
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
        assert_eq!((a0, s0, t0), (0, EBDA_START, E820_RAM));
        let (a1, t1) = (e[1].addr, e[1].r#type);
        assert_eq!((a1, t1), (EBDA_START, E820_RESERVED));
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
        assert_eq!(ram, mem - (HIMEM_START - EBDA_START));
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
