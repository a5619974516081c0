//! Which guest kernel, system disk (and, for user-supplied images, initramfs) a VM boots.

use std::path::PathBuf;

use crate::image::{self, Cache, EnsureOptions, ImageError, Profile, ProgressMode};

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
    /// disk) and was built from this build's recipe (kernel patches, config fragments): an
    /// image from an older recipe or layout is never used silently.
    pub fn from_cached(dir: &std::path::Path, m: &image::Manifest) -> Option<GuestImage> {
        if !m.is_current_layout() || !image::build::recipe_matches(&m.kernel_inputs) {
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

    /// The newest cached image of the profile this host needs that [`GuestImage::from_cached`]
    /// accepts, without building anything ([`GuestImage::ensure`] builds the current one).
    pub fn cached() -> Result<Option<GuestImage>, SandboxError> {
        let profile = image::resolve_profile(image::ProfileChoice::Auto).map_err(env)?;
        let cache = Cache::open(None).map_err(env)?;
        let (images, _broken) = cache.list().map_err(env)?;
        Ok(images
            .iter()
            .filter(|i| i.manifest.profile == profile)
            .find_map(|i| GuestImage::from_cached(&i.dir, &i.manifest)))
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
                "no guest image, and building it failed: {e}\n  help: run `voidbox image build` and retry"
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

fn env(e: ImageError) -> SandboxError {
    SandboxError::Environment(e.to_string())
}
