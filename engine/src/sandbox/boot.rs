//! User-supplied boot files (void-box compatibility): `sandbox.kernel`, `sandbox.initramfs`
//! and `sandbox.guest_image` (an OCI image holding a kernel and an initramfs).
//!
//! - A kernel alone boots with voidbox's system disk as its root (`root=/dev/vda`, erofs),
//!   so it needs virtio-mmio command-line devices, virtio-blk, erofs, devtmpfs and vsock
//!   built in; when it lacks one, the boot error names it ([`super::diagnose`]).
//! - An initramfs becomes the guest's root file system: voidbox's guest agent is appended
//!   to it as `/voidbox-agent` (the kernel unpacks concatenated archives in order) and runs
//!   as init (`rdinit=/voidbox-agent`); the archive's own `/init` is not run, and its
//!   programs are what commands find. A gzip archive is decompressed here (the interpreted
//!   guest kernel is slow at it, and voidbox's kernel has no decompressors); other
//!   compressions are refused.
//!
//! The combined initramfs is cached by content under `$XDG_CACHE_HOME/voidbox/boot/`.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::GuestImage;
use crate::image::cpio::single_executable;
use crate::image::manifest::content_hash;

/// Name of the guest agent appended to a user initramfs.
pub const AGENT_IN_INITRAMFS: &str = "voidbox-agent";
/// Largest initramfs accepted (after decompression).
pub const MAX_INITRAMFS_BYTES: u64 = 1 << 30;

/// Where a node's kernel and initramfs come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootSource {
    /// `sandbox.kernel` (absolute).
    pub kernel: Option<PathBuf>,
    /// `sandbox.initramfs` (absolute).
    pub initramfs: Option<PathBuf>,
    /// `sandbox.guest_image` (an OCI reference).
    pub guest_image: Option<String>,
}

impl BootSource {
    /// True when the built-in image boots unchanged.
    pub fn is_default(&self) -> bool {
        self.kernel.is_none() && self.initramfs.is_none() && self.guest_image.is_none()
    }
}

/// The image a node with `src` boots: `base` with the user's kernel and/or initramfs
/// (`files`: what `guest_image` provided; explicit paths win over it).
pub fn custom_boot(
    base: &GuestImage,
    src: &BootSource,
    files: Option<&voidbox_oci::BootFiles>,
) -> Result<GuestImage, String> {
    let kernel = src
        .kernel
        .clone()
        .or_else(|| files.map(|f| f.kernel.clone()))
        .unwrap_or_else(|| base.vmlinux.clone());
    let kernel_sha = check_kernel(&kernel)?;
    let initramfs = src
        .initramfs
        .clone()
        .or_else(|| files.and_then(|f| f.initramfs.clone()));
    let mut img = base.clone();
    img.vmlinux = kernel;
    let mut initramfs_sha = None;
    if let Some(path) = initramfs {
        let agent = std::fs::read(&base.agent)
            .map_err(|e| format!("reading the guest agent {}: {e}", base.agent.display()))?;
        let combined = with_agent(&read_initramfs(&path)?, &agent)?;
        let sha = hex::encode(Sha256::digest(&combined));
        img.initramfs = Some(store(&combined, &sha)?);
        img.cmdline = format!("{} rdinit=/{AGENT_IN_INITRAMFS}", base.cmdline);
        initramfs_sha = Some(sha);
    }
    img.hash = content_hash(&("custom-boot", &base.hash, kernel_sha, initramfs_sha));
    Ok(img)
}

/// Checks `path` is an x86-64 ELF vmlinux or a bzImage; returns its SHA-256.
fn check_kernel(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("kernel {}: {e}", path.display()))?;
    let elf64_x86 = bytes.len() > 20
        && bytes.starts_with(b"\x7fELF")
        && bytes[4] == 2
        && u16::from_le_bytes([bytes[18], bytes[19]]) == 0x3e;
    let bzimage = bytes.get(0x202..0x206) == Some(b"HdrS".as_slice());
    if !elf64_x86 && !bzimage {
        return Err(format!(
            "kernel {} is neither an x86-64 ELF vmlinux nor a bzImage",
            path.display()
        ));
    }
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// The archive at `path`, decompressed if it is gzip; other compressions are refused.
fn read_initramfs(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("initramfs {}: {e}", path.display()))?;
    let mut raw = Vec::new();
    f.take(MAX_INITRAMFS_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("initramfs {}: {e}", path.display()))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .take(MAX_INITRAMFS_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("initramfs {}: not valid gzip: {e}", path.display()))?;
        out
    } else {
        raw
    };
    if bytes.len() as u64 > MAX_INITRAMFS_BYTES {
        return Err(format!(
            "initramfs {} is larger than {} MiB",
            path.display(),
            MAX_INITRAMFS_BYTES >> 20
        ));
    }
    let compressed = [
        (&[0xfd, 0x37, 0x7a, 0x58, 0x5a][..], "xz"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
        (&[0x02, 0x21, 0x4c, 0x18][..], "lz4"),
        (&[0x42, 0x5a, 0x68][..], "bzip2"),
        (&[0x5d, 0x00, 0x00][..], "lzma"),
        (&[0x89, 0x4c, 0x5a, 0x4f][..], "lzo"),
    ];
    if let Some((_, name)) = compressed.iter().find(|(m, _)| bytes.starts_with(m)) {
        return Err(format!(
            "initramfs {} is {name}-compressed: voidbox takes an uncompressed or gzip newc archive (`{name} -d` it first)",
            path.display()
        ));
    }
    if !(bytes.starts_with(b"070701") || bytes.starts_with(b"070702")) {
        return Err(format!(
            "initramfs {} is not a newc cpio archive (`find . | cpio -o -H newc` makes one)",
            path.display()
        ));
    }
    Ok(bytes)
}

/// `archive` (padded to 4 bytes) followed by a one-file archive with the agent.
fn with_agent(archive: &[u8], agent: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = archive.to_vec();
    out.resize(out.len().div_ceil(4) * 4, 0);
    let tail = single_executable(AGENT_IN_INITRAMFS, agent).map_err(|e| e.to_string())?;
    out.extend_from_slice(&tail);
    Ok(out)
}

/// Writes `bytes` to the boot cache as `<sha>.cpio` (atomically), unless it is there.
fn store(bytes: &[u8], sha: &str) -> Result<PathBuf, String> {
    let dir = crate::image::cache::Cache::default_root()
        .map(|r| r.join("boot"))
        .map_err(|e| format!("boot file cache: {e}"))?;
    let path = dir.join(format!("{sha}.cpio"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)
        .map_err(|e| format!("writing into {}: {e}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .map_err(|e| format!("writing into {}: {e}", dir.display()))?;
    tmp.persist(&path)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::cpio::{Archive, Kind};

    fn newc(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut a = Archive::new();
        for (p, b) in files {
            crate::image::layout::add_executable(&mut a, p, b).unwrap();
        }
        a.to_bytes().unwrap()
    }

    #[test]
    fn initramfs_gets_the_agent_and_gzip_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let plain = newc(&[("init", b"#!/bin/sh\n")]);
        let p = dir.path().join("i.cpio");
        std::fs::write(&p, &plain).unwrap();
        let gz = dir.path().join("i.cpio.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &plain).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(read_initramfs(&gz).unwrap(), read_initramfs(&p).unwrap());
        let combined = with_agent(&read_initramfs(&p).unwrap(), b"\x7fELFagent").unwrap();
        // The kernel's view: both archives, the agent last.
        let second = &combined[plain.len().div_ceil(4) * 4..];
        let a = Archive::parse(second).unwrap();
        assert_eq!(
            a.get(AGENT_IN_INITRAMFS).unwrap().kind,
            Kind::File(b"\x7fELFagent".to_vec())
        );
        assert!(Archive::parse(&combined[..plain.len()])
            .unwrap()
            .get("init")
            .is_some());
    }

    #[test]
    fn bad_boot_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let xz = dir.path().join("i.xz");
        std::fs::write(&xz, [0xfd, 0x37, 0x7a, 0x58, 0x5a, 0, 1, 2]).unwrap();
        assert!(read_initramfs(&xz).unwrap_err().contains("xz-compressed"));
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"hello world, not an archive").unwrap();
        assert!(read_initramfs(&junk).unwrap_err().contains("newc"));
        assert!(read_initramfs(&dir.path().join("missing"))
            .unwrap_err()
            .contains("missing"));
        assert!(check_kernel(&junk).unwrap_err().contains("bzImage"));
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[18] = 0x3e;
        let k = dir.path().join("vmlinux");
        std::fs::write(&k, &elf).unwrap();
        check_kernel(&k).unwrap();
        elf[18] = 0xb7; // aarch64
        std::fs::write(&k, &elf).unwrap();
        assert!(check_kernel(&k).is_err());
    }
}
