//! 64-bit Linux boot protocol: kernel (ELF `vmlinux` or `bzImage`) and initramfs loading,
//! command line, zero page with e820, MP table, GDT and identity page tables.

pub mod gdt;
pub mod mptable;
pub mod paging;
pub mod params;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, ReadVolatile};

use crate::memory::{low_ram_end, ram_size, GuestMem};

/// GDT location.
pub const BOOT_GDT_START: u64 = 0x500;
/// (Empty) IDT location.
pub const BOOT_IDT_START: u64 = 0x520;
/// `struct boot_params` location.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// PML4 table.
pub const PML4_START: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPTE_START: u64 = 0xa000;
/// Page directory.
pub const PDE_START: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// The restore page ([`crate::restore_page`]): reserved in e820 up to the EBDA, so the
/// guest kernel never uses it as RAM.
pub const RESTORE_PAGE_START: u64 = voidbox_protocol::restore_page::GPA;
/// Start of the EBDA / last KiB of base memory, reserved in e820.
pub const EBDA_START: u64 = 0x9fc00;
/// Where the MP table goes.
pub const MPTABLE_START: u64 = EBDA_START;
/// Start of high memory (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;
// The restore page sits between the boot page tables and the EBDA's page.
const _: () = assert!(
    RESTORE_PAGE_START + voidbox_protocol::restore_page::LEN as u64 <= (EBDA_START & !0xfff)
        && RESTORE_PAGE_START >= PDE_START + 0x1000
        && RESTORE_PAGE_START.is_multiple_of(0x1000)
);
/// Offset of the 64-bit entry point in a loaded bzImage's protected-mode kernel.
pub const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

/// Errors while preparing the guest for boot.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Kernel file cannot be opened/read.
    #[error("cannot read kernel {0}: {1}")]
    KernelFile(String, String),
    /// Kernel is neither a loadable ELF nor a bzImage.
    #[error("cannot load kernel: {0}")]
    KernelLoad(String),
    /// Initramfs file cannot be read or placed.
    #[error("cannot load initramfs: {0}")]
    InitramfsFile(String),
    /// Initramfs does not fit.
    #[error("initramfs does not fit in guest memory")]
    Initramfs,
    /// Command line too long or cannot be written.
    #[error("cannot write kernel command line")]
    Cmdline,
    /// Guest memory too small for the boot layout.
    #[error("guest memory too small")]
    MemoryTooSmall,
    /// e820 table full.
    #[error("e820 table full")]
    E820Full,
    /// MP table problem.
    #[error("MP table: {0}")]
    MpTable(&'static str),
    /// Cannot write the zero page.
    #[error("cannot write boot params")]
    ZeroPage,
    /// Cannot write the GDT/IDT.
    #[error("cannot write GDT/IDT")]
    Gdt,
    /// Cannot write page tables.
    #[error("cannot write page tables")]
    PageTables,
}

/// Where the kernel landed.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// 64-bit entry point (guest-physical).
    pub entry: GuestAddress,
    /// First byte after the kernel image.
    pub end: u64,
    /// bzImage setup header (None for ELF).
    pub setup_header: Option<setup_header>,
}

/// Loads an ELF `vmlinux` or a `bzImage` into guest memory.
pub fn load_kernel(mem: &GuestMem, path: &Path) -> Result<LoadedKernel, BootError> {
    let err = |e: std::io::Error| BootError::KernelFile(path.display().to_string(), e.to_string());
    let mut file = File::open(path).map_err(err)?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(err)?;
    file.seek(SeekFrom::Start(0)).map_err(err)?;
    if &magic == b"\x7fELF" {
        let res = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
            .map_err(|e| BootError::KernelLoad(format!("ELF: {e}")))?;
        Ok(LoadedKernel {
            entry: res.kernel_load,
            end: res.kernel_end,
            setup_header: None,
        })
    } else {
        let res = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
            .map_err(|e| BootError::KernelLoad(format!("bzImage: {e}")))?;
        let entry = res
            .kernel_load
            .checked_add(BZIMAGE_64BIT_ENTRY_OFFSET)
            .ok_or_else(|| BootError::KernelLoad("entry overflows".into()))?;
        Ok(LoadedKernel {
            entry,
            end: res.kernel_end,
            setup_header: res.setup_header,
        })
    }
}

/// Chooses where an initramfs of `size` bytes goes: page-aligned, as high as possible below
/// `min(mem_end, max_addr)`, above the kernel. `mem_end` is the end of the RAM region at 0
/// (below the 32-bit MMIO gap).
pub fn initramfs_address(
    mem_end: u64,
    max_addr: u64,
    kernel_end: u64,
    size: u64,
) -> Result<u64, BootError> {
    let top = mem_end.min(max_addr.saturating_add(1));
    let addr = top.checked_sub(size).ok_or(BootError::Initramfs)? & !0xfff;
    if addr < kernel_end || addr < HIMEM_START {
        return Err(BootError::Initramfs);
    }
    Ok(addr)
}

/// Loads the initramfs from `path`; returns `(address, size)`.
pub fn load_initramfs(
    mem: &GuestMem,
    path: &Path,
    kernel: &LoadedKernel,
) -> Result<(u64, u64), BootError> {
    let err = |e: std::io::Error| BootError::InitramfsFile(format!("{}: {e}", path.display()));
    let mut file = File::open(path).map_err(err)?;
    let size = file.metadata().map_err(err)?.len();
    if size == 0 {
        return Err(BootError::InitramfsFile(format!(
            "{} is empty",
            path.display()
        )));
    }
    let max_addr = kernel
        .setup_header
        .map(|h| u64::from(h.initrd_addr_max))
        .filter(|m| *m != 0)
        .unwrap_or(0x7fff_ffff);
    let mem_end = low_ram_end(mem);
    let addr = initramfs_address(mem_end, max_addr, kernel.end, size)?;
    let len = usize::try_from(size).map_err(|_| BootError::Initramfs)?;
    let mut slice = mem
        .get_slice(GuestAddress(addr), len)
        .map_err(|_| BootError::Initramfs)?;
    file.read_exact_volatile(&mut slice)
        .map_err(|e| BootError::InitramfsFile(format!("{}: {e}", path.display())))?;
    Ok((addr, size))
}

/// Writes the NUL-terminated command line at [`CMDLINE_START`].
pub fn write_cmdline(mem: &GuestMem, cmdline: &str) -> Result<(), BootError> {
    if cmdline.len() + 1 > crate::config::MAX_CMDLINE_LEN || cmdline.contains('\0') {
        return Err(BootError::Cmdline);
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_START))
        .map_err(|_| BootError::Cmdline)
}

/// Writes the zero page and MP table.
pub fn configure_system(
    mem: &GuestMem,
    cmdline_len: usize,
    initrd: Option<(u64, u64)>,
    setup_header: Option<setup_header>,
    num_cpus: u8,
) -> Result<(), BootError> {
    let mem_size = ram_size(mem);
    let params = params::build_boot_params(&params::BootParamsInput {
        mem_size,
        cmdline_len: u32::try_from(cmdline_len).map_err(|_| BootError::Cmdline)?,
        initrd,
        setup_header,
    })?;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
        .map_err(|_| BootError::ZeroPage)?;
    mptable::setup_mptable(mem, num_cpus)
}

/// Writes the boot GDT and an empty IDT; returns the GDT.
pub fn write_gdt_idt(mem: &GuestMem) -> Result<[u64; 4], BootError> {
    let gdt = gdt::boot_gdt();
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + 8 * i as u64))
            .map_err(|_| BootError::Gdt)?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|_| BootError::Gdt)?;
    Ok(gdt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;
    use linux_loader::loader::bootparam::boot_params;
    use std::io::Write;

    #[test]
    fn initramfs_placement() {
        let a = initramfs_address(256 << 20, 0x7fff_ffff, 32 << 20, 0x1234).unwrap();
        assert_eq!(a % 4096, 0);
        assert!(a + 0x1234 <= 256 << 20);
        // Too big to fit above the kernel.
        assert!(initramfs_address(64 << 20, 0x7fff_ffff, 32 << 20, 40 << 20).is_err());
        // Larger than memory.
        assert!(initramfs_address(64 << 20, 0x7fff_ffff, 0, u64::MAX).is_err());
        // initrd_addr_max caps the top.
        let a = initramfs_address(3 << 30, 0x7fff_ffff, 0, 4096).unwrap();
        assert!(a + 4096 <= 0x8000_0000);
    }

    #[test]
    fn cmdline_written_nul_terminated() {
        let mem = create_guest_memory(32 << 20).unwrap();
        write_cmdline(&mem, "console=ttyS0").unwrap();
        let mut buf = [0u8; 14];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_START))
            .unwrap();
        assert_eq!(&buf, b"console=ttyS0\0");
        assert!(write_cmdline(&mem, &"x".repeat(4096)).is_err());
    }

    #[test]
    fn large_guest_boot_structures_stay_below_the_gap() {
        let mem = create_guest_memory(4 << 30).unwrap();
        configure_system(&mem, 10, None, None, 1).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap();
        assert_eq!(p.e820_entries, 4);
        let last = p.e820_table[3];
        assert_eq!(({ last.addr }, { last.size }), (4 << 30, 1 << 30));
        // The initramfs goes below the gap even when the kernel would accept it higher.
        let a = initramfs_address(low_ram_end(&mem), u64::from(u32::MAX), 0, 4096).unwrap();
        assert_eq!(a, crate::memory::MMIO_GAP_START - 4096);
    }

    #[test]
    fn zero_page_written() {
        let mem = create_guest_memory(32 << 20).unwrap();
        configure_system(&mem, 10, None, None, 2).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap();
        assert_eq!(p.e820_entries, 3);
        assert_eq!({ p.hdr.cmdline_size }, 10);
        // RAM stops at the restore page; it, the EBDA and the legacy hole are reserved.
        let (ram, reserved) = (p.e820_table[0], p.e820_table[1]);
        assert_eq!(
            ({ ram.addr }, { ram.size }, { ram.r#type }),
            (0, RESTORE_PAGE_START, 1)
        );
        assert_eq!(
            ({ reserved.addr }, { reserved.size }, { reserved.r#type }),
            (RESTORE_PAGE_START, HIMEM_START - RESTORE_PAGE_START, 2)
        );
    }

    #[test]
    fn garbage_kernel_rejected() {
        let mem = create_guest_memory(32 << 20).unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0u8; 8192]).unwrap();
        assert!(matches!(
            load_kernel(&mem, f.path()),
            Err(BootError::KernelLoad(_))
        ));
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"\x7fELF garbage").unwrap();
        assert!(load_kernel(&mem, f.path()).is_err());
        assert!(matches!(
            load_kernel(&mem, Path::new("/nonexistent/vmlinux")),
            Err(BootError::KernelFile(..))
        ));
    }
}
