//! The erofs file: the staging tree's modes, packing it with the engine's `mkfs.erofs`
//! settings ([`crate::image::erofs::pack`]: owners root, timestamps 0, a fixed UUID, no
//! xattrs, so the same files give the same bytes), hashing it, and reading it back with
//! `fsck.erofs --extract` for verification.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use super::error::RuntimesError;
use super::manifest::MANIFEST_FILE;

/// Mode of every shipped file (executables; read-only disk).
pub const FILE_MODE: u32 = 0o555;
/// Mode of `manifest.json`.
pub const MANIFEST_MODE: u32 = 0o444;
/// Mode of every directory.
pub const DIR_MODE: u32 = 0o755;

/// Creates the parent directories of each disk path under `tree`.
pub(crate) fn make_parents<'a>(
    tree: &Path,
    paths: impl IntoIterator<Item = &'a str>,
) -> Result<(), RuntimesError> {
    for p in paths {
        if let Some(parent) = tree.join(p).parent() {
            fs::create_dir_all(parent).map_err(RuntimesError::io(parent))?;
        }
    }
    Ok(())
}

/// Sets the modes of everything under `tree` (and `tree` itself): directories
/// [`DIR_MODE`], `manifest.json` at the root [`MANIFEST_MODE`], other files [`FILE_MODE`].
pub(crate) fn set_modes(tree: &Path) -> Result<(), RuntimesError> {
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        set_mode(&dir, DIR_MODE)?;
        for entry in fs::read_dir(&dir).map_err(RuntimesError::io(&dir))? {
            let p = entry.map_err(RuntimesError::io(&dir))?.path();
            let md = fs::symlink_metadata(&p).map_err(RuntimesError::io(&p))?;
            if md.is_dir() {
                stack.push(p);
            } else if dir == tree && p.file_name().is_some_and(|n| n == MANIFEST_FILE) {
                set_mode(&p, MANIFEST_MODE)?;
            } else {
                set_mode(&p, FILE_MODE)?;
            }
        }
    }
    Ok(())
}

fn set_mode(p: &Path, mode: u32) -> Result<(), RuntimesError> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(RuntimesError::io(p))
}

/// Packs `tree` into the erofs file `out`.
pub(crate) fn pack(tree: &Path, out: &Path) -> Result<(), RuntimesError> {
    Ok(crate::image::erofs::pack(tree, out)?)
}

/// Size and SHA-256 (hex) of a file, read in 1 MiB chunks.
pub fn sha256_file(path: &Path) -> Result<(u64, String), RuntimesError> {
    let mut f = File::open(path).map_err(RuntimesError::io(path))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(RuntimesError::io(path)(e)),
        };
        hash.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, hex::encode(hash.finalize())))
}

/// One entry of a disk read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Permission bits.
    pub mode: u32,
    /// `None` for a directory; size and SHA-256 (hex) for a file.
    pub file: Option<(u64, String)>,
}

/// Checks the erofs file `image` with `fsck.erofs` (every file decoded), extracts it under
/// `scratch/extract` and returns its entries by path (removed after). Anything but
/// directories and regular files is an error.
pub fn read_back(image: &Path, scratch: &Path) -> Result<BTreeMap<String, Found>, String> {
    let dest = scratch.join("extract");
    let res = Command::new("fsck.erofs")
        .arg(format!("--extract={}", dest.display()))
        .arg(image)
        .output()
        .map_err(|e| {
            format!(
                "running fsck.erofs: {e} (install Debian's {})",
                crate::image::erofs::EROFS_PACKAGE
            )
        })?;
    let found = if res.status.success() {
        walk(&dest)
    } else {
        Err(format!(
            "fsck.erofs: {}",
            crate::image::deps::tail(&String::from_utf8_lossy(&res.stderr), 5)
        ))
    };
    let _ = fs::remove_dir_all(&dest);
    found
}

fn walk(root: &Path) -> Result<BTreeMap<String, Found>, String> {
    let err = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).map_err(|e| err(&dir, &e))? {
            let p = entry.map_err(|e| err(&dir, &e))?.path();
            let md = fs::symlink_metadata(&p).map_err(|e| err(&p, &e))?;
            let rel = p
                .strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| format!("{}: not a UTF-8 path", p.display()))?
                .to_string();
            let file = if md.is_dir() {
                stack.push(p.clone());
                None
            } else if md.is_file() {
                Some(sha256_file(&p).map_err(|e| e.to_string())?)
            } else {
                return Err(format!("{rel}: neither a directory nor a regular file"));
            };
            out.insert(
                rel,
                Found {
                    mode: md.mode() & 0o7777,
                    file,
                },
            );
        }
    }
    Ok(out)
}
