//! Which guest kernel + initramfs a VM boots.

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
    /// Uncompressed initramfs with the agent as `/init`.
    pub initramfs: PathBuf,
    /// Kernel profile (`compat` turns on the VMM's compat flags).
    pub profile: Profile,
    /// Command line the image expects (the VMM adds its own base flags).
    pub cmdline: String,
}

impl GuestImage {
    /// The newest cached image of the profile this host needs that was built from this
    /// build's recipe (kernel patches, config fragments: an image from an older recipe is
    /// never used silently — [`GuestImage::ensure`] then builds the current one), without
    /// building anything.
    pub fn cached() -> Result<Option<GuestImage>, SandboxError> {
        let profile = image::resolve_profile(image::ProfileChoice::Auto).map_err(env)?;
        let cache = Cache::open(None).map_err(env)?;
        let (images, _broken) = cache.list().map_err(env)?;
        Ok(images
            .into_iter()
            .find(|i| {
                i.manifest.profile == profile
                    && image::build::recipe_matches(&i.manifest.kernel_inputs)
            })
            .map(|i| GuestImage {
                hash: i
                    .dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                vmlinux: i.dir.join(&i.manifest.vmlinux.file),
                initramfs: i.dir.join(&i.manifest.initramfs.file),
                profile: i.manifest.profile,
                cmdline: i.manifest.cmdline.clone(),
            })
            .filter(|g| g.vmlinux.is_file() && g.initramfs.is_file()))
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
        Ok(GuestImage {
            hash: info.hash,
            vmlinux: info.vmlinux,
            initramfs: info.initramfs,
            profile: info.profile,
            cmdline: info.cmdline,
        })
    }
}

fn env(e: ImageError) -> SandboxError {
    SandboxError::Environment(e.to_string())
}
