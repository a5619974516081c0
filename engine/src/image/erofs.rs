//! The system disk: the guest's root tree ([`super::layout`]) written to a staging
//! directory and packed into a read-only erofs image by `mkfs.erofs` (Debian
//! `erofs-utils`), and read back with `fsck.erofs --extract` for verification.
//!
//! Reproducible: every timestamp is 0 (`-T0`), the UUID is fixed, every file is owned by
//! root (`--all-root`), no extended attributes are taken from the staging directory
//! (`-x-1`), modes come from the tree, and `mkfs.erofs` orders entries by name whatever
//! order the staging directory was written in. Uncompressed: the guest kernel reads the
//! bytes as they are (decompressing in an emulated guest kernel costs more than the I/O).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

use super::cpio::{Archive, Entry, Kind};
use super::error::ImageError;
use super::recipe::FILE_MTIME;

/// Debian package providing `mkfs.erofs` and `fsck.erofs`.
pub const EROFS_PACKAGE: &str = "erofs-utils";
/// The fixed filesystem UUID of every system disk.
pub const SYSTEM_DISK_UUID: &str = "5f1d0c8e-7a4b-4c2e-9b1a-766f6964626f";

/// Writes `tree` under `dir` (which must not exist yet): directories, regular files and
/// symbolic links with the tree's permission bits. Device nodes are refused (they would
/// need root; the guest gets them from devtmpfs).
pub fn write_tree(tree: &Archive, dir: &Path) -> Result<(), ImageError> {
    fs::create_dir(dir).map_err(ImageError::io(dir))?;
    // Archive order is sorted by path, so parents come first; directory modes are set
    // last so a read-only directory does not stop its own children being written.
    let mut dirs = Vec::new();
    for (path, e) in tree.entries() {
        let p = dir.join(path);
        match &e.kind {
            Kind::Dir => {
                fs::create_dir(&p).map_err(ImageError::io(&p))?;
                dirs.push((p, e.perm));
            }
            Kind::File(data) => {
                fs::write(&p, data).map_err(ImageError::io(&p))?;
                fs::set_permissions(&p, fs::Permissions::from_mode(e.perm))
                    .map_err(ImageError::io(&p))?;
            }
            Kind::Symlink(target) => symlink(target, &p).map_err(ImageError::io(&p))?,
            Kind::CharDev { .. } => {
                return Err(ImageError::Environment(format!(
                    "/{path}: device nodes cannot go onto the system disk"
                )))
            }
        }
    }
    for (p, perm) in dirs.into_iter().rev() {
        fs::set_permissions(&p, fs::Permissions::from_mode(perm)).map_err(ImageError::io(&p))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(ImageError::io(dir))
}

/// Packs the directory `tree` into the erofs image `out`.
pub fn pack(tree: &Path, out: &Path) -> Result<(), ImageError> {
    let res = Command::new("mkfs.erofs")
        .arg("-x-1")
        .arg(format!("-T{FILE_MTIME}"))
        .arg(format!("-U{SYSTEM_DISK_UUID}"))
        .arg("--all-root")
        .arg("--quiet")
        .arg(out)
        .arg(tree)
        .output()
        .map_err(|e| {
            ImageError::Environment(format!(
                "running mkfs.erofs: {e} (install Debian's {EROFS_PACKAGE})"
            ))
        })?;
    if !res.status.success() {
        return Err(ImageError::Step {
            step: format!("mkfs.erofs {} {}", out.display(), tree.display()),
            log_tail: String::from_utf8_lossy(&res.stderr).into_owned(),
            log: None,
        });
    }
    Ok(())
}

/// Builds the erofs image `out` from `tree`, staging it in `scratch/tree` (removed after).
pub fn build(tree: &Archive, scratch: &Path, out: &Path) -> Result<(), ImageError> {
    let staging = scratch.join("tree");
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(ImageError::io(&staging))?;
    }
    write_tree(tree, &staging)?;
    let packed = pack(&staging, out);
    fs::remove_dir_all(&staging).map_err(ImageError::io(&staging))?;
    packed
}

/// Checks the erofs image `image` with `fsck.erofs` (every file decoded) and reads its tree
/// back, extracting it under `scratch/extract` (removed after).
pub fn read_back(image: &Path, scratch: &Path) -> Result<Archive, String> {
    let dest = scratch.join("extract");
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    let res = Command::new("fsck.erofs")
        .arg(format!("--extract={}", dest.display()))
        .arg(image)
        .output()
        .map_err(|e| format!("running fsck.erofs: {e} (install Debian's {EROFS_PACKAGE})"))?;
    let tree = if res.status.success() {
        read_tree(&dest)
    } else {
        Err(format!(
            "fsck.erofs: {}",
            super::deps::tail(&String::from_utf8_lossy(&res.stderr), 5)
        ))
    };
    let _ = fs::remove_dir_all(&dest);
    tree
}

/// Reads the tree under `dir` (directories, regular files, symbolic links; anything else
/// is an error) into an [`Archive`].
pub fn read_tree(dir: &Path) -> Result<Archive, String> {
    use std::os::unix::fs::MetadataExt;
    let mut a = Archive::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for entry in rd {
            let entry = entry.map_err(|e| format!("{}: {e}", d.display()))?;
            let p = entry.path();
            let md = fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let rel = p
                .strip_prefix(dir)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| format!("{}: not a UTF-8 path", p.display()))?
                .to_string();
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push(p.clone());
                Kind::Dir
            } else if ft.is_file() {
                Kind::File(fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?)
            } else if ft.is_symlink() {
                let t = fs::read_link(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                Kind::Symlink(
                    t.to_str()
                        .ok_or_else(|| format!("{}: not a UTF-8 link", p.display()))?
                        .to_string(),
                )
            } else {
                return Err(format!("/{rel}: unexpected file type"));
            };
            let entry = Entry {
                perm: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                mtime: u32::try_from(md.mtime()).unwrap_or(u32::MAX),
                kind,
            };
            a.insert(&rel, entry).map_err(|e| e.to_string())?;
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have_erofs_utils() -> bool {
        Command::new("mkfs.erofs").arg("--help").output().is_ok()
    }

    fn tree(order_reversed: bool) -> Archive {
        let applets: Vec<String> = super::super::recipe::REQUIRED_APPLETS
            .iter()
            .map(|a| format!("bin/{a}"))
            .collect();
        let mut a =
            super::super::layout::build(b"\x7fELFagent", b"\x7fELFbusybox", &applets).unwrap();
        let extra = [
            ("opt/voidbox/runtimes/x/bin/tool", b"\x7fELFtool".to_vec()),
            ("opt/voidbox/runtimes/x/big", vec![7u8; 100_000]),
        ];
        let mut items: Vec<_> = extra.iter().collect();
        if order_reversed {
            items.reverse();
        }
        for (p, d) in items {
            super::super::layout::add_executable(&mut a, p, d).unwrap();
        }
        a
    }

    #[test]
    fn disk_is_reproducible_and_reads_back_to_the_same_tree() {
        if !have_erofs_utils() {
            panic!("mkfs.erofs is needed (Debian: erofs-utils)");
        }
        let tmp = tempfile::tempdir().unwrap();
        let (s1, s2) = (tmp.path().join("s1"), tmp.path().join("s2"));
        fs::create_dir_all(&s1).unwrap();
        fs::create_dir_all(&s2).unwrap();
        let (d1, d2) = (tmp.path().join("1.erofs"), tmp.path().join("2.erofs"));
        build(&tree(false), &s1, &d1).unwrap();
        // Staged in another order, at another time: the same bytes.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        build(&tree(true), &s2, &d2).unwrap();
        let (b1, b2) = (fs::read(&d1).unwrap(), fs::read(&d2).unwrap());
        assert_eq!(
            b1, b2,
            "mkfs.erofs output must not depend on staging order or time"
        );
        assert_eq!(
            b1.len() % 4096,
            0,
            "whole blocks (a virtio-blk disk is sectors)"
        );
        assert!(!s1.join("tree").exists(), "staging is cleaned up");

        let back = read_back(&d1, tmp.path()).unwrap();
        let want = tree(false);
        assert_eq!(back.len(), want.len());
        for (path, e) in want.entries() {
            let got = back.get(path).unwrap_or_else(|| panic!("{path} missing"));
            assert_eq!(got.kind, e.kind, "{path}");
            assert_eq!(got.perm, e.perm, "{path}");
            assert_eq!(got.mtime, 0, "{path}");
            if super::super::deps::is_root() {
                // (Extracted by another user, files belong to that user.)
                assert_eq!(got.uid, 0, "{path}");
            }
        }
        assert!(super::super::layout::check(&back).is_empty());
        assert!(!tmp.path().join("extract").exists());

        // A corrupted disk is caught.
        let mut bad = b1.clone();
        bad[1024..1040].fill(0xff); // the superblock
        fs::write(&d2, &bad).unwrap();
        assert!(read_back(&d2, tmp.path()).is_err());
    }

    #[test]
    fn device_nodes_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut a = Archive::new();
        a.insert(
            "console",
            Entry {
                perm: 0o600,
                uid: 0,
                gid: 0,
                mtime: 0,
                kind: Kind::CharDev { major: 5, minor: 1 },
            },
        )
        .unwrap();
        let err = write_tree(&a, &tmp.path().join("t")).unwrap_err();
        assert!(err.to_string().contains("device nodes"), "{err}");
    }
}
