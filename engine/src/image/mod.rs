//! The guest image: a Linux kernel (`vmlinux`) built from Debian's `linux-source-6.1`
//! with the recipe in `guest-agent/image/`, and a read-only erofs system disk (the guest's
//! root: the guest agent, busybox, the runtimes) that the kernel mounts as `/dev/vda` —
//! built on first use and cached by content hash.
//!
//! Entry points: [`ensure_image`] for the apply/run paths, [`run_cli`] for
//! `voidbox image build|ls|rm|verify|probe`. See `guest-agent/image/README.md`.

pub mod build;
pub mod bundle;
pub mod busybox;
pub mod cache;
pub mod cpio;
pub mod deps;
pub mod erofs;
pub mod error;
pub mod guest_agent;
pub mod kconfig;
pub mod kernel;
pub mod layout;
pub mod manifest;
pub mod progress;
pub mod recipe;
pub mod registry;
#[doc(hidden)]
pub mod testing;
pub mod verify;

use std::path::{Path, PathBuf};

pub use crate::output::{Format, ProgressMode};
pub use cache::Cache;
pub use error::ImageError;
pub use manifest::Manifest;
pub use recipe::Profile;
use voidbox_vmm::probe::{self, HostKvm};

/// Which profile to build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileChoice {
    /// Probe the host's KVM: `compat` where it emulates guest kernel mode, else `plain`.
    #[default]
    Auto,
    /// Stock kernel for hardware virtualisation.
    Plain,
    /// Patched kernel for KVM that emulates guest kernel mode.
    Compat,
}

/// Options of [`ensure_image`].
#[derive(Debug, Clone, Default)]
pub struct EnsureOptions {
    /// Profile to use (`Auto` probes the host).
    pub profile: ProfileChoice,
    /// Cache root (default: `$XDG_CACHE_HOME/voidbox`).
    pub cache_dir: Option<PathBuf>,
    /// Guest agent binary (default: see [`guest_agent::resolve`]).
    pub guest_agent: Option<PathBuf>,
    /// Parallel compile jobs (default: available cores).
    pub jobs: Option<usize>,
    /// Rebuild even when cached.
    pub force: bool,
    /// Keep the kernel build tree.
    pub keep_build_dir: bool,
    /// Progress output.
    pub progress: ProgressMode,
}

/// A ready image.
#[derive(Debug, Clone)]
pub struct ImageInfo {
    /// Content hash (directory name).
    pub hash: String,
    /// Image directory.
    pub dir: PathBuf,
    /// Uncompressed ELF kernel (PVH note present; entry at 16 MiB).
    pub vmlinux: PathBuf,
    /// The read-only erofs system disk (the guest's root, `/dev/vda`).
    pub system_disk: PathBuf,
    /// The stripped static guest agent (the same bytes as on the system disk).
    pub agent: PathBuf,
    /// Kernel profile.
    pub profile: Profile,
    /// `uname -r` of the guest.
    pub kernel_release: String,
    /// Kernel command line the image expects; the VMM appends devices and `voidbox.*`.
    pub cmdline: String,
    /// Full manifest.
    pub manifest: Manifest,
    /// Whether it was built by this call.
    pub freshly_built: bool,
}

impl ImageInfo {
    fn from_dir(dir: &Path, manifest: Manifest, fresh: bool) -> ImageInfo {
        let file = |a: &Option<manifest::Artifact>| {
            dir.join(a.as_ref().map(|a| a.file.as_str()).unwrap_or_default())
        };
        ImageInfo {
            hash: manifest.hash.clone(),
            dir: dir.to_path_buf(),
            vmlinux: dir.join(&manifest.vmlinux.file),
            system_disk: file(&manifest.system_disk),
            agent: file(&manifest.agent),
            profile: manifest.profile,
            kernel_release: manifest.kernel.release.clone(),
            cmdline: manifest.cmdline.clone(),
            manifest,
            freshly_built: fresh,
        }
    }
}

/// Maps the probe's verdict to a profile.
pub fn profile_for(host: HostKvm) -> Profile {
    match host {
        HostKvm::Hardware => Profile::Plain,
        HostKvm::EmulatedKernelMode => Profile::Compat,
    }
}

/// Resolves `Auto` with the host KVM probe.
pub fn resolve_profile(choice: ProfileChoice) -> Result<Profile, ImageError> {
    Ok(match choice {
        ProfileChoice::Plain => Profile::Plain,
        ProfileChoice::Compat => Profile::Compat,
        ProfileChoice::Auto => profile_for(probe::probe()?.kind),
    })
}

/// Returns the image for these options, building it first if it is not cached
/// (minutes, with progress on stderr). Environment problems (no apt/root/network, no
/// KVM for `Auto`, no guest agent) are [`ImageError::Environment`]/[`ImageError::Probe`],
/// whose [`ImageError::exit_code`] is 3.
pub fn ensure_image(opts: &EnsureOptions) -> Result<ImageInfo, ImageError> {
    let cache = Cache::open(opts.cache_dir.as_deref())?;
    let profile = resolve_profile(opts.profile)?;
    let mut p = progress::Progress::new(opts.progress);
    let agent = build::resolve_agent(opts.guest_agent.as_deref(), &p)?;
    let req = build::BuildRequest {
        profile,
        guest_agent: agent,
        jobs: opts.jobs.unwrap_or_else(default_jobs),
        force: opts.force,
        keep_build_dir: opts.keep_build_dir,
    };
    let built = build::build(&cache, &req, &mut p)?;
    p.finish();
    Ok(ImageInfo::from_dir(&built.dir, built.manifest, built.fresh))
}

/// Available cores.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_mapping() {
        assert_eq!(profile_for(HostKvm::Hardware), Profile::Plain);
        assert_eq!(profile_for(HostKvm::EmulatedKernelMode), Profile::Compat);
        assert_eq!(
            resolve_profile(ProfileChoice::Plain).unwrap(),
            Profile::Plain
        );
    }
}
