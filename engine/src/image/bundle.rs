//! Guest images shipped beside the voidbox binary — the release tarball and the Python
//! wheel put them at `<prefix>/share/voidbox/images/<hash>/` next to `<prefix>/bin/voidbox`.
//!
//! The bundle is a read-only image cache: nothing is written there (no locks, no temp
//! files), and an image is used only after its artifacts are re-hashed against its
//! manifest, so a truncated or altered file is an error, never a boot. A bundled image of
//! the host's profile built from this voidbox's recipe is preferred to the user's cache and
//! means no kernel build.

use std::path::{Path, PathBuf};

use super::cache::{Cache, CachedImage};
use super::error::ImageError;
use super::manifest::{sha256_file, Manifest};
use super::recipe::Profile;

/// Where the bundle lives, relative to the directory holding the `voidbox` executable.
pub const BUNDLE_SUBDIR: &str = "../share/voidbox";

/// Overrides the bundle location (a directory holding `images/`); for packagers whose
/// layout is not `bin/` + `share/`.
pub const BUNDLE_ENV: &str = "VOIDBOX_BUNDLE_DIR";

/// The bundle root (it holds `images/`) of this executable, if it has one.
///
/// `$VOIDBOX_BUNDLE_DIR` when set (it must then exist: a typo is an error, not a silent
/// kernel build), else `<dir of the executable>/../share/voidbox`. The executable's path is
/// the kernel's (`/proc/self/exe`), so symlinks such as pipx's `~/.local/bin/voidbox`
/// resolve to the install they point into.
pub fn root() -> Result<Option<PathBuf>, ImageError> {
    if let Some(dir) = std::env::var_os(BUNDLE_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dir.join("images").is_dir() {
            return Err(ImageError::Environment(format!(
                "{BUNDLE_ENV}={}: no images/ directory there",
                dir.display()
            )));
        }
        return Ok(Some(dir));
    }
    let Ok(exe) = std::env::current_exe() else {
        return Ok(None);
    };
    Ok(exe
        .parent()
        .map(|bin| normalize(&bin.join(BUNDLE_SUBDIR)))
        .filter(|r| r.join("images").is_dir()))
}

/// `a/bin/../share` → `a/share` without touching the filesystem (the path is shown to users).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The bundle as a read-only [`Cache`] (for listing; never build or lock in it).
pub fn cache() -> Result<Option<Cache>, ImageError> {
    Ok(root()?.map(Cache::new))
}

/// The bundled image of `profile` that `usable` accepts (layout and recipe of this build),
/// verified; `Ok(None)` when there is no bundle or it holds no such image.
///
/// A bundled image that fits but does not match its manifest is an error: a damaged install
/// is reported, not silently replaced by a kernel build.
pub fn find(
    profile: Profile,
    usable: impl Fn(&CachedImage) -> bool,
) -> Result<Option<CachedImage>, ImageError> {
    let Some(bundle) = cache()? else {
        return Ok(None);
    };
    let (images, _broken) = bundle.list()?;
    let Some(image) = images
        .into_iter()
        .find(|i| i.manifest.profile == profile && usable(i))
    else {
        return Ok(None);
    };
    verify_artifacts(&image.dir, &image.manifest)?;
    Ok(Some(image))
}

/// Every bundled image `usable` accepts, of any profile, verified (plain first): what the
/// bundle offers where the host's profile is unknown (no usable `/dev/kvm` to probe with).
/// An image that fails verification is an error, as in [`find`].
pub fn find_all(usable: impl Fn(&CachedImage) -> bool) -> Result<Vec<CachedImage>, ImageError> {
    let Some(bundle) = cache()? else {
        return Ok(Vec::new());
    };
    let (mut images, _broken) = bundle.list()?;
    images.retain(|i| usable(i));
    images.sort_by_key(|i| i.manifest.profile != Profile::Plain);
    for i in &images {
        verify_artifacts(&i.dir, &i.manifest)?;
    }
    Ok(images)
}

/// Re-hashes every artifact the manifest lists (size and SHA-256).
///
/// This is the cheap half of `voidbox image verify` (no fsck of the disk): ≈40 ms for both
/// files of an image with SHA-NI, paid once per `apply`/`run`.
pub fn verify_artifacts(dir: &Path, m: &Manifest) -> Result<(), ImageError> {
    let mut problems = Vec::new();
    for a in m.artifacts() {
        let path = dir.join(&a.file);
        match std::fs::metadata(&path) {
            Err(e) => problems.push(format!("{}: {e}", path.display())),
            Ok(md) if md.len() != a.size => problems.push(format!(
                "{}: {} bytes, the manifest says {}",
                path.display(),
                md.len(),
                a.size
            )),
            Ok(_) => {
                let got = sha256_file(&path)?;
                if got != a.sha256 {
                    problems.push(format!(
                        "{}: sha256 {got}, the manifest says {}",
                        path.display(),
                        a.sha256
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        problems.push("reinstall voidbox: its bundled guest image is damaged".into());
        Err(ImageError::Verify {
            hash: m.hash.clone(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_parent_components() {
        assert_eq!(
            normalize(Path::new("/opt/vb/bin/../share/voidbox")),
            PathBuf::from("/opt/vb/share/voidbox")
        );
    }
}
