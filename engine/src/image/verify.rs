//! `voidbox image verify`: re-hashes an image's artifacts against its manifest and
//! checks that they look bootable (ELF64 x86-64 kernel with the expected entry and a
//! PVH note; a system disk that `fsck.erofs` reads back in full, holding the guest agent
//! recorded in the manifest, busybox and the directory layout). Images of the old layout
//! (kernel + initramfs) fail: they are never booted.

use std::path::Path;

use super::error::ImageError;
use super::manifest::{sha256_file, sha256_hex, Artifact, Manifest, LEGACY_FORMAT};
use super::recipe::{self, Profile};
use super::{erofs, layout};

/// Physical load address / entry of our `vmlinux` (CONFIG_PHYSICAL_START, not relocatable).
pub const EXPECTED_ENTRY: u64 = 0x100_0000;

/// Facts read from a `vmlinux`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_entry` (physical address of `startup_64`).
    pub entry: u64,
    /// The PVH entry point from the `XEN_ELFNOTE_PHYS32_ENTRY` note, if present.
    pub pvh_entry: Option<u64>,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    b.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

/// Parses the ELF header and notes of a kernel image.
pub fn parse_vmlinux(b: &[u8]) -> Result<ElfInfo, String> {
    if b.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let e_type = u16_at(b, 16).ok_or("truncated ELF header")?;
    let machine = u16_at(b, 18).ok_or("truncated ELF header")?;
    if e_type != 2 {
        return Err(format!("ELF type {e_type}, expected 2 (executable)"));
    }
    if machine != 62 {
        return Err(format!("ELF machine {machine}, expected 62 (x86-64)"));
    }
    let entry = u64_at(b, 24).ok_or("truncated ELF header")?;
    let phoff = u64_at(b, 32).ok_or("truncated ELF header")? as usize;
    let phentsize = usize::from(u16_at(b, 54).ok_or("truncated ELF header")?);
    let phnum = usize::from(u16_at(b, 56).ok_or("truncated ELF header")?);
    let mut pvh_entry = None;
    for i in 0..phnum {
        let ph = phoff
            .checked_add(i * phentsize)
            .ok_or("bad program headers")?;
        if u32_at(b, ph).ok_or("truncated program headers")? != 4 {
            continue; // not PT_NOTE
        }
        let off = u64_at(b, ph + 8).ok_or("truncated program header")? as usize;
        let size = u64_at(b, ph + 32).ok_or("truncated program header")? as usize;
        let notes = b
            .get(off..off.saturating_add(size))
            .ok_or("note segment out of bounds")?;
        let mut p = 0usize;
        while p + 12 <= notes.len() {
            let (Some(namesz), Some(descsz), Some(ty)) =
                (u32_at(notes, p), u32_at(notes, p + 4), u32_at(notes, p + 8))
            else {
                break;
            };
            let name_start = p + 12;
            let desc_start = name_start + (namesz as usize).next_multiple_of(4);
            let next = desc_start + (descsz as usize).next_multiple_of(4);
            let name = notes.get(name_start..name_start + namesz as usize);
            // XEN_ELFNOTE_PHYS32_ENTRY = 18
            if name == Some(b"Xen\0") && ty == 18 {
                pvh_entry = match descsz {
                    4 => u32_at(notes, desc_start).map(u64::from),
                    8 => u64_at(notes, desc_start),
                    _ => None,
                };
            }
            p = next;
        }
    }
    Ok(ElfInfo { entry, pvh_entry })
}

/// Checks one artifact's size and hash.
fn check_artifact(dir: &Path, a: &Artifact, problems: &mut Vec<String>) {
    let path = dir.join(&a.file);
    match std::fs::metadata(&path) {
        Err(e) => problems.push(format!("{}: {e}", a.file)),
        Ok(m) if m.len() != a.size => problems.push(format!(
            "{}: size {} != manifest {}",
            a.file,
            m.len(),
            a.size
        )),
        Ok(_) => match sha256_file(&path) {
            Ok(h) if h == a.sha256 => {}
            Ok(h) => problems.push(format!("{}: sha256 {h} != manifest {}", a.file, a.sha256)),
            Err(e) => problems.push(e.to_string()),
        },
    }
}

/// Result of a successful verification.
#[derive(Debug, Clone)]
pub struct VerifyReport {
    /// The manifest.
    pub manifest: Manifest,
    /// Kernel ELF facts.
    pub elf: ElfInfo,
    /// Number of entries (files, directories, links) on the system disk.
    pub disk_entries: usize,
}

/// Verifies the image in `dir`; `scratch` is an empty directory for reading the system disk
/// back (left empty).
pub fn verify_dir(dir: &Path, scratch: &Path) -> Result<VerifyReport, ImageError> {
    let manifest = Manifest::load(dir)?;
    let mut problems = Vec::new();
    if manifest.format == LEGACY_FORMAT {
        problems.push(
            "old layout (kernel + initramfs, manifest format 1): never booted by this voidbox; \
             remove it with `voidbox image rm` (the next run builds the current one)"
                .into(),
        );
    }
    for a in manifest.artifacts() {
        check_artifact(dir, a, &mut problems);
    }
    if dir.file_name().and_then(|n| n.to_str()) != Some(manifest.hash.as_str()) {
        problems.push("directory name differs from the manifest hash".into());
    }
    if manifest.config.sha256 != manifest.kernel.config_sha256 {
        problems.push("config artifact differs from kernel.config_sha256".into());
    }
    if manifest.format != LEGACY_FORMAT
        && manifest.cmdline != recipe::image_cmdline(manifest.profile)
    {
        problems.push("cmdline differs from the profile's".into());
    }

    let cfg_path = dir.join(&manifest.config.file);
    match std::fs::read_to_string(&cfg_path) {
        Ok(cfg) => {
            let compat = cfg.lines().any(|l| l == "CONFIG_VOIDBOX_EMULATED_KVM=y");
            if compat != (manifest.profile == Profile::Compat) {
                problems.push(format!(
                    "profile {} but CONFIG_VOIDBOX_EMULATED_KVM is {}",
                    manifest.profile,
                    if compat { "y" } else { "not set" }
                ));
            }
        }
        Err(e) => problems.push(format!("{}: {e}", cfg_path.display())),
    }

    let vmlinux = dir.join(&manifest.vmlinux.file);
    let elf = match std::fs::read(&vmlinux) {
        Ok(b) => match parse_vmlinux(&b) {
            Ok(e) => {
                if e.entry != EXPECTED_ENTRY {
                    problems.push(format!(
                        "vmlinux entry {:#x}, expected {EXPECTED_ENTRY:#x}",
                        e.entry
                    ));
                }
                if e.pvh_entry.is_none() {
                    problems.push("vmlinux has no PVH entry note (CONFIG_PVH)".into());
                }
                Some(e)
            }
            Err(e) => {
                problems.push(format!("vmlinux: {e}"));
                None
            }
        },
        Err(e) => {
            problems.push(format!("vmlinux: {e}"));
            None
        }
    };

    if let Some(agent) = &manifest.agent {
        if agent.sha256 != manifest.init_sha256 {
            problems.push(format!(
                "{} differs from the manifest's init_sha256",
                agent.file
            ));
        }
    }
    let mut entries = 0;
    if let Some(disk) = &manifest.system_disk {
        if disk.size % 512 != 0 {
            problems.push(format!(
                "{}: size is not a whole number of sectors",
                disk.file
            ));
        }
        match erofs::read_back(&dir.join(&disk.file), scratch) {
            Ok(tree) => {
                entries = tree.len();
                problems.extend(
                    layout::check(&tree)
                        .into_iter()
                        .map(|p| format!("{}: {p}", disk.file)),
                );
                if layout::agent(&tree).map(sha256_hex).as_deref()
                    != Some(manifest.init_sha256.as_str())
                {
                    problems.push(format!(
                        "{}: the guest agent differs from the manifest's init_sha256",
                        disk.file
                    ));
                }
                if let Some(recorded) = manifest.path_program_set() {
                    let found: std::collections::BTreeSet<String> =
                        layout::path_programs(&tree).into_iter().collect();
                    if found != recorded {
                        problems.push(format!(
                            "{}: programs on PATH differ from the manifest's",
                            disk.file
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("{}: {e}", disk.file)),
        }
    }

    match (problems.is_empty(), elf) {
        (true, Some(elf)) => Ok(VerifyReport {
            manifest,
            elf,
            disk_entries: entries,
        }),
        _ => Err(ImageError::Verify {
            hash: manifest.hash,
            problems,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 x86-64 executable with one PT_NOTE holding a PVH note.
    pub(crate) fn fake_vmlinux(entry: u64, pvh: Option<u32>) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[16..18].copy_from_slice(&2u16.to_le_bytes());
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b[24..32].copy_from_slice(&entry.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&1u16.to_le_bytes());
        let mut note = Vec::new();
        note.extend(4u32.to_le_bytes());
        note.extend(4u32.to_le_bytes());
        note.extend(if pvh.is_some() { 18u32 } else { 5u32 }.to_le_bytes());
        note.extend(b"Xen\0");
        note.extend(pvh.unwrap_or(0).to_le_bytes());
        let off = b.len() as u64;
        b[64..68].copy_from_slice(&4u32.to_le_bytes());
        b[64 + 8..64 + 16].copy_from_slice(&off.to_le_bytes());
        b[64 + 32..64 + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        b.extend(note);
        b
    }

    #[test]
    fn parses_entry_and_pvh_note() {
        let e = parse_vmlinux(&fake_vmlinux(EXPECTED_ENTRY, Some(0x100_0200))).unwrap();
        assert_eq!(e.entry, EXPECTED_ENTRY);
        assert_eq!(e.pvh_entry, Some(0x100_0200));
        assert_eq!(
            parse_vmlinux(&fake_vmlinux(1, None)).unwrap().pvh_entry,
            None
        );
    }

    #[test]
    fn rejects_non_kernels() {
        assert!(parse_vmlinux(b"MZ").is_err());
        let mut b = fake_vmlinux(0, None);
        b[18] = 40; // ARM
        assert!(parse_vmlinux(&b).unwrap_err().contains("machine"));
        let b = fake_vmlinux(0, None);
        for cut in [10, 30, 60] {
            assert!(parse_vmlinux(&b[..cut]).is_err());
        }
        // Truncated note segment: an error, not a panic.
        assert!(parse_vmlinux(&b[..b.len() - 4]).is_err());
    }

    #[test]
    fn real_vmlinux_if_given() {
        // VOIDBOX_TEST_VMLINUX=path checks a real kernel.
        let Some(p) = std::env::var_os("VOIDBOX_TEST_VMLINUX") else {
            return;
        };
        let e = parse_vmlinux(&std::fs::read(p).unwrap()).unwrap();
        assert_eq!(e.entry, EXPECTED_ENTRY);
        assert!(e.pvh_entry.is_some());
    }
}
