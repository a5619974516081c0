//! Kernel and initramfs of a void-box guest image, copied out of the unpacked root.
//!
//! Kernel: the first of [`KERNEL_PATHS`]; initramfs: the first of [`INITRAMFS_PATHS`]. Both
//! may be symlinks inside the image. A gzip-compressed initramfs is decompressed into a plain
//! cpio archive (the guest kernel is built without gzip support).

use crate::error::{IoContext, OciError};
use crate::resolve::Root;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where a guest image keeps its kernel, in order of preference.
pub const KERNEL_PATHS: &[&str] = &["/vmlinux", "/vmlinuz", "/boot/vmlinux", "/boot/vmlinuz"];
/// Where a guest image keeps its initramfs, in order of preference.
pub const INITRAMFS_PATHS: &[&str] = &[
    "/initramfs.cpio",
    "/initramfs.cpio.gz",
    "/rootfs.cpio",
    "/rootfs.cpio.gz",
    "/boot/initramfs.cpio",
    "/boot/initramfs.cpio.gz",
];

/// File name of the extracted kernel inside an image's cache directory.
pub(crate) const KERNEL_FILE: &str = "boot/kernel";
/// File name of the extracted (uncompressed) initramfs inside an image's cache directory.
pub(crate) const INITRAMFS_FILE: &str = "boot/initramfs.cpio";

/// Copies the kernel and initramfs (when present) from `root` into `out/boot/`.
/// Returns whether each was found.
pub(crate) fn extract(root: &Root, out: &Path) -> Result<(bool, bool), OciError> {
    let kernel = copy_first(root, KERNEL_PATHS, &out.join(KERNEL_FILE), false)?;
    let initramfs = copy_first(root, INITRAMFS_PATHS, &out.join(INITRAMFS_FILE), true)?;
    Ok((kernel, initramfs))
}

fn copy_first(
    root: &Root,
    candidates: &[&str],
    dest: &Path,
    gunzip: bool,
) -> Result<bool, OciError> {
    for cand in candidates {
        let rel = PathBuf::from(cand.trim_start_matches('/'));
        let Ok(file) = root.open_file(&rel) else {
            continue;
        };
        let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !is_file {
            continue;
        }
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        let mut out = std::fs::File::create(dest).ctx(|| format!("creating {}", dest.display()))?;
        let mut reader = std::io::BufReader::new(file);
        let copied = if gunzip && is_gzip(&mut reader) {
            std::io::copy(&mut flate2::bufread::MultiGzDecoder::new(reader), &mut out)
        } else {
            std::io::copy(&mut reader, &mut out)
        };
        copied.ctx(|| format!("copying {cand} out of the image"))?;
        out.flush().ctx(|| format!("writing {}", dest.display()))?;
        return Ok(true);
    }
    Ok(false)
}

fn is_gzip<R: Read>(r: &mut std::io::BufReader<R>) -> bool {
    use std::io::BufRead;
    matches!(r.fill_buf(), Ok(b) if b.starts_with(&[0x1f, 0x8b]))
}
