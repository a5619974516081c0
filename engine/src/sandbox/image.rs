//! Which guest kernel, system disk (and, for user-supplied images, initramfs) a VM boots.

use std::path::PathBuf;

use crate::image::{self, Cache, EnsureOptions, ImageError, Profile};
use crate::output::ProgressMode;

use super::error::SandboxError;

/// The artifacts a VM boots.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// Content hash of the cached image (its directory name); part of snapshot keys.
    pub hash: String,
    /// ELF vmlinux.
    pub vmlinux: PathBuf,
    /// The read-only erofs system disk, attached as `/dev/vda` (the guest's root).
    pub system_disk: PathBuf,
    /// SHA-256 of the system disk (from the manifest); part of snapshot keys.
    pub system_disk_sha256: String,
    /// The stripped static guest agent (the same bytes as on the system disk).
    pub agent: PathBuf,
    /// An initramfs to boot with; `None` for the images voidbox builds, which boot from
    /// their system disk.
    pub initramfs: Option<PathBuf>,
    /// Kernel profile (`compat` turns on the VMM's compat flags).
    pub profile: Profile,
    /// Command line the image expects (the VMM adds its own base flags).
    pub cmdline: String,
}

impl GuestImage {
    /// The image a cached manifest describes, if it has the current layout (kernel + system
    /// disk) and was built from this build's recipe (kernel patches, config fragments, a
    /// busybox whose `wget -T` works): an image from an older recipe or layout is never used
    /// silently ([`image::build::stale_reason`]).
    pub fn from_cached(dir: &std::path::Path, m: &image::Manifest) -> Option<GuestImage> {
        if image::build::stale_reason(m).is_some() {
            return None;
        }
        let disk = m.system_disk.as_ref()?;
        let agent = m.agent.as_ref()?;
        Some(GuestImage {
            hash: m.hash.clone(),
            vmlinux: dir.join(&m.vmlinux.file),
            system_disk: dir.join(&disk.file),
            system_disk_sha256: disk.sha256.clone(),
            agent: dir.join(&agent.file),
            initramfs: None,
            profile: m.profile,
            cmdline: m.cmdline.clone(),
        })
        .filter(|g| g.vmlinux.is_file() && g.system_disk.is_file())
    }

    /// The image this host boots, without building anything ([`GuestImage::ensure`] builds
    /// one when there is none), looked up in this order:
    /// 1. `$VOIDBOX_GUEST_IMAGE`: pulled from that registry reference (an error, never a
    ///    fallback, when it cannot be had or is of another profile);
    /// 2. the image bundled beside the executable (verified against its manifest);
    /// 3. the newest image in the user's cache.
    ///
    /// Each must be of the host's profile and accepted by [`GuestImage::from_cached`].
    pub fn cached() -> Result<Option<GuestImage>, SandboxError> {
        Ok(GuestImage::locate()?.map(|(g, _)| g))
    }

    /// [`GuestImage::cached`], with where the image was found.
    pub fn locate() -> Result<Option<(GuestImage, ImageSource)>, SandboxError> {
        let profile = image::resolve_profile(image::ProfileChoice::Auto).map_err(env)?;
        let cache = Cache::open(None).map_err(env)?;
        let usable = |i: &image::cache::CachedImage| GuestImage::from_cached(&i.dir, &i.manifest);
        if let Some(i) = image::registry::image_from_env(&cache, profile).map_err(env)? {
            let g = usable(&i).ok_or_else(|| {
                SandboxError::Environment(format!(
                    "the image pulled for ${} ({}) is not one this voidbox boots (another recipe or layout)",
                    image::registry::GUEST_IMAGE_ENV,
                    i.dir.display()
                ))
            })?;
            return Ok(Some((g, ImageSource::Registry)));
        }
        if let Some(i) = image::bundle::find(profile, |i| usable(i).is_some()).map_err(env)? {
            return Ok(usable(&i).map(|g| (g, ImageSource::Bundled)));
        }
        let (images, _broken) = cache.list().map_err(env)?;
        Ok(images
            .iter()
            .filter(|i| i.manifest.profile == profile)
            .find_map(usable)
            .map(|g| (g, ImageSource::Cached)))
    }

    /// The image `apply --dry-run` checks a plan against, building nothing: the one
    /// [`GuestImage::cached`] finds where `/dev/kvm` is usable; where it is not (so the
    /// host's profile cannot be probed), a bundled image of either profile, else a cached
    /// one (the profiles differ in their kernel only, not in the programs on the disk).
    pub fn for_checks() -> Result<Option<GuestImage>, SandboxError> {
        if super::kvm_access::access().is_ok() {
            return GuestImage::cached();
        }
        let usable = |i: &image::cache::CachedImage| GuestImage::from_cached(&i.dir, &i.manifest);
        let bundled = image::bundle::find_all(|i| usable(i).is_some()).map_err(env)?;
        if let Some(g) = bundled.first().and_then(usable) {
            return Ok(Some(g));
        }
        let (images, _broken) = Cache::open(None).map_err(env)?.list().map_err(env)?;
        Ok(images.iter().find_map(usable))
    }

    /// The cached image, or one built now (minutes; progress on stderr per `progress`).
    pub fn ensure(progress: ProgressMode) -> Result<GuestImage, SandboxError> {
        if let Some(g) = GuestImage::cached()? {
            return Ok(g);
        }
        let info = image::ensure_image(&EnsureOptions {
            progress,
            ..EnsureOptions::default()
        })
        .map_err(|e| {
            SandboxError::Environment(format!(
                "no guest image for this host, and building one failed: {e}\n  help: use a prebuilt image instead — \
                 install a voidbox release (tarball or `pip install`), or `voidbox image pull REF` / \
                 set {}=REF; or run `voidbox image build` (needs root and Debian packages) and retry",
                image::registry::GUEST_IMAGE_ENV
            ))
        })?;
        GuestImage::from_cached(&info.dir, &info.manifest).ok_or_else(|| {
            SandboxError::Environment(format!(
                "the guest image just built in {} is incomplete\n  help: run `voidbox image verify`",
                info.dir.display()
            ))
        })
    }
}

/// Where [`GuestImage::locate`] found the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource {
    /// Pulled from `$VOIDBOX_GUEST_IMAGE`.
    Registry,
    /// Shipped beside the executable.
    Bundled,
    /// The user's image cache.
    Cached,
}

fn env(e: ImageError) -> SandboxError {
    SandboxError::Environment(e.to_string())
}
