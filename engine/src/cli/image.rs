//! `voidbox image`: build, list, remove, verify, push, pull and probe guest images. The
//! command lives above `image` (the builder and cache), `runtimes` (its disks are listed and
//! verified with the images) and `sandbox` (which image a run would boot).

use std::path::PathBuf;
use std::process::ExitCode;

use voidbox_vmm::probe::{self as kvm_probe, HostKvm};

use crate::image::manifest::{self, Manifest};
use crate::image::{
    build as image_build, bundle, ensure_image, profile_for, registry, verify as image_verify,
    Cache, EnsureOptions, ImageError, ImageInfo, ProfileChoice,
};
use crate::output::{Format, ProgressMode};
use crate::units::{age, human_age, human_size};

/// `voidbox image` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Build the guest image (kernel + system disk) and the runtimes disk (agent CLIs from
    /// npm) into the cache; takes minutes the first time.
    Build(BuildArgs),
    /// List cached images (and runtimes disks).
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Remove cached images by hash prefix, or all of them.
    Rm {
        /// Hash prefixes of the images to remove.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        hashes: Vec<String>,
        /// Remove every image and cached kernel.
        #[arg(long)]
        all: bool,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Check cached images: artifact hashes vs manifest, kernel ELF, system disk contents.
    Verify {
        /// Hash prefixes (default: every cached image).
        hashes: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Push a cached guest image to an OCI registry as an artifact (prints its digest).
    Push {
        /// Where to push: `registry/repository[:tag]`.
        reference: String,
        /// Hash prefix of the image (default: the newest usable one of `--profile`).
        hash: Option<String>,
        /// Profile of the image to push when no hash is given; `auto` probes the host's KVM.
        #[arg(long, value_enum, default_value_t = ProfileChoice::Auto)]
        profile: ProfileChoice,
        /// A registry (`host[:port]`) that may be spoken to over plain HTTP (loopback ones
        /// always are); repeatable.
        #[arg(long = "insecure-registry", value_name = "HOST", value_parser = crate::oci::parse_registry_host)]
        insecure_registries: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Pull a guest image artifact from an OCI registry into the cache (verified in full).
    Pull {
        /// What to pull: `registry/repository[:tag]` or `registry/repository@sha256:…`.
        reference: String,
        /// A registry (`host[:port]`) that may be spoken to over plain HTTP (loopback ones
        /// always are); repeatable.
        #[arg(long = "insecure-registry", value_name = "HOST", value_parser = crate::oci::parse_registry_host)]
        insecure_registries: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Probe the host's KVM (hardware or emulated guest kernel mode) and the profile it needs.
    Probe {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
}

/// `voidbox image build` flags.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// Kernel profile; `auto` probes the host's KVM.
    #[arg(long, value_enum, default_value_t = ProfileChoice::Auto)]
    pub profile: ProfileChoice,
    /// Guest agent binary, PID 1 of every VM (default: build it from this source tree).
    #[arg(long, value_name = "PATH")]
    pub guest_agent: Option<PathBuf>,
    /// Parallel compile jobs (default: number of cores).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Rebuild even if the image (and its kernel) are cached.
    #[arg(long)]
    pub force: bool,
    /// Keep the kernel build tree (under the cache's tmp/).
    #[arg(long)]
    pub keep_build_dir: bool,
    /// Cache root (default: $XDG_CACHE_HOME/voidbox or ~/.cache/voidbox).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Skip the runtimes disk (the agent CLIs, fetched from the npm registry).
    #[arg(long)]
    pub no_runtimes: bool,
}

/// Runs a `voidbox image` subcommand.
pub fn run_cli(cmd: ImageCommand) -> ExitCode {
    match run(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cmd: ImageCommand) -> Result<ExitCode, ImageError> {
    match cmd {
        ImageCommand::Build(args) => build(args),
        ImageCommand::Ls { format, cache_dir } => ls(format, cache_dir),
        ImageCommand::Rm {
            hashes,
            all,
            cache_dir,
        } => rm(hashes, all, cache_dir),
        ImageCommand::Verify {
            hashes,
            format,
            cache_dir,
        } => verify(hashes, format, cache_dir),
        ImageCommand::Push {
            reference,
            hash,
            profile,
            insecure_registries,
            format,
            cache_dir,
        } => registry::cli_push(
            &reference,
            hash.as_deref(),
            profile,
            &insecure_registries,
            format,
            cache_dir.as_deref(),
        ),
        ImageCommand::Pull {
            reference,
            insecure_registries,
            format,
            cache_dir,
        } => registry::cli_pull(
            &reference,
            &insecure_registries,
            format,
            cache_dir.as_deref(),
        ),
        ImageCommand::Probe { format } => probe(format),
    }
}

/// `voidbox image build`.
fn build(args: BuildArgs) -> Result<ExitCode, ImageError> {
    let BuildArgs {
        profile,
        guest_agent,
        jobs,
        force,
        keep_build_dir,
        cache_dir,
        format,
        no_runtimes,
    } = args;
    let runtimes_root = cache_dir.clone();
    if profile == ProfileChoice::Auto {
        let r = kvm_probe::probe()?;
        eprintln!("host KVM: {} ({})", r.kind, describe_probe(&r));
    }
    let info = ensure_image(&EnsureOptions {
        profile,
        cache_dir,
        guest_agent,
        jobs,
        force,
        keep_build_dir,
        progress: ProgressMode::Auto,
    })?;
    eprintln!(
        "{} image {} ({} profile, kernel {}){}",
        if info.freshly_built {
            "built"
        } else {
            "cached"
        },
        info.hash,
        info.profile,
        info.kernel_release,
        if info.freshly_built {
            format!(" in {:.0}s", info.manifest.build_seconds)
        } else {
            String::new()
        }
    );
    let runtimes = if no_runtimes {
        None
    } else {
        Some(crate::runtimes::cli::ensure_logged(
            runtimes_root.as_deref(),
        )?)
    };
    match format {
        Format::Json => println!("{}", info_json(&info, runtimes.as_ref())),
        Format::Human => {
            println!("{}", info.dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `voidbox image ls`.
fn ls(format: Format, cache_dir: Option<PathBuf>) -> Result<ExitCode, ImageError> {
    let cache = Cache::open(cache_dir.as_deref())?;
    let (mut images, mut broken) = cache.list()?;
    let cached = images.len();
    // Images bundled beside the executable (read-only; listed after the cache's).
    if let Some(b) = bundle::cache()? {
        let (more, bad) = b.list()?;
        images.extend(more);
        broken.extend(bad);
    }
    let source = |i: usize| if i < cached { "cache" } else { "bundled" };
    match format {
        Format::Json => {
            let v: Vec<_> = images
                .iter()
                .enumerate()
                .map(|(n, i)| {
                    serde_json::json!({
                        "hash": i.manifest.hash,
                        "source": source(n),
                        "dir": i.dir,
                        "profile": i.manifest.profile,
                        "kernel_release": i.manifest.kernel.release,
                        "layout": layout_name(&i.manifest),
                        "vmlinux_size": i.manifest.vmlinux.size,
                        "system_disk_size": i.manifest.system_disk.as_ref().map(|a| a.size),
                        "initramfs_size": i.manifest.initramfs.as_ref().map(|a| a.size),
                        "created_unix": i.manifest.created_unix,
                        "age_seconds": age(i.manifest.created_unix),
                        "stale": image_build::stale_reason(&i.manifest),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Format::Human => {
            if images.is_empty() {
                eprintln!("no cached images in {}", cache.images_dir().display());
            } else {
                println!(
                    "{:<14} {:<8} {:<18} {:>9} {:>11} {:>8} {:<8} STATE",
                    "HASH", "PROFILE", "KERNEL", "VMLINUX", "SYSTEM DISK", "AGE", "SOURCE"
                );
                for (n, i) in images.iter().enumerate() {
                    let m = &i.manifest;
                    let disk = match &m.system_disk {
                        Some(d) => human_size(d.size),
                        // Listed so it can be removed; never booted.
                        None => "old layout".to_string(),
                    };
                    // The same verdict as `image verify` and `doctor`.
                    let state = image_build::stale_reason(m)
                        .map_or_else(|| "current".to_string(), |why| format!("stale: {why}"));
                    println!(
                        "{:<14} {:<8} {:<18} {:>9} {:>11} {:>8} {:<8} {state}",
                        m.hash.get(..12).unwrap_or(&m.hash),
                        m.profile.as_str(),
                        m.kernel.release,
                        human_size(m.vmlinux.size),
                        disk,
                        human_age(age(m.created_unix)),
                        source(n)
                    );
                }
            }
            // (JSON lists images only: `voidbox runtimes ls --format json`.)
            if let Ok((disks, _)) = crate::runtimes::list(Some(cache.root())) {
                if !disks.is_empty() {
                    println!();
                    crate::runtimes::cli::print_table(&disks);
                }
            }
        }
    }
    for (dir, e) in &broken {
        eprintln!("warning: {}: {e}", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `voidbox image rm`.
fn rm(hashes: Vec<String>, all: bool, cache_dir: Option<PathBuf>) -> Result<ExitCode, ImageError> {
    let cache = Cache::open(cache_dir.as_deref())?;
    if all {
        let n = cache.remove_all()?;
        eprintln!("removed {n} image(s) and all cached kernels");
        return Ok(ExitCode::SUCCESS);
    }
    // Resolve everything first so a typo removes nothing.
    let resolved = hashes
        .iter()
        .map(|h| cache.resolve(h))
        .collect::<Result<Vec<_>, _>>()?;
    for h in resolved {
        cache.remove(&h)?;
        eprintln!("removed {h}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `voidbox image verify`.
fn verify(
    hashes: Vec<String>,
    format: Format,
    cache_dir: Option<PathBuf>,
) -> Result<ExitCode, ImageError> {
    let cache = Cache::open(cache_dir.as_deref())?;
    let implicit = hashes.is_empty();
    let mut targets: Vec<(String, PathBuf)> = if implicit {
        cache.find("")?
    } else {
        hashes
            .iter()
            .map(|h| cache.resolve(h))
            .collect::<Result<Vec<_>, _>>()?
    }
    .into_iter()
    .map(|h| {
        let dir = cache.image_dir(&h);
        (h, dir)
    })
    .collect();
    // Every bundled image too (they are read-only; a damaged one means reinstalling).
    if implicit {
        if let Some(b) = bundle::cache()? {
            for h in b.find("")? {
                targets.push((h.clone(), b.image_dir(&h)));
            }
        }
    }
    if targets.is_empty() {
        return Err(ImageError::NotFound(format!(
            "no cached images in {} (run `voidbox image build`)",
            cache.images_dir().display()
        )));
    }
    let mut failed = 0;
    let mut out = Vec::new();
    let tmp = cache.tmp_dir()?;
    for (h, dir) in targets {
        // Images of the old layout, or made by an older builder, are never booted by
        // this voidbox: verifying "all" reports them as stale (they are unused, not
        // corrupt); naming one still verifies it against today's layout.
        let stale = manifest::Manifest::load(&dir)
            .ok()
            .and_then(|m| image_build::stale_reason(&m));
        if let (true, Some(why)) = (implicit, stale) {
            if format == Format::Human {
                println!(
                    "stale {}: {why}, never booted; remove it with `voidbox image rm {}`",
                    h.get(..12).unwrap_or(&h),
                    h.get(..12).unwrap_or(&h)
                );
            }
            out.push(serde_json::json!({"hash": h, "ok": true, "stale": true}));
            continue;
        }
        let scratch = tempfile::Builder::new()
            .prefix("verify-")
            .tempdir_in(&tmp)
            .map_err(ImageError::io(&tmp))?;
        match image_verify::verify_dir(&dir, scratch.path()) {
            Ok(r) => {
                let disk_size = r.manifest.system_disk.as_ref().map(|a| a.size);
                if format == Format::Human {
                    println!(
                        "ok {} {} kernel {} entry {:#x} pvh {:#x} system disk {} ({} entries)",
                        &h[..12],
                        r.manifest.profile,
                        r.manifest.kernel.release,
                        r.elf.entry,
                        r.elf.pvh_entry.unwrap_or_default(),
                        human_size(disk_size.unwrap_or_default()),
                        r.disk_entries
                    );
                }
                out.push(
                    serde_json::json!({"hash": h, "ok": true, "profile": r.manifest.profile,
                    "kernel_release": r.manifest.kernel.release, "entry": r.elf.entry,
                    "pvh_entry": r.elf.pvh_entry, "system_disk_size": disk_size,
                    "system_disk_entries": r.disk_entries}),
                );
            }
            Err(e) => {
                failed += 1;
                if format == Format::Human {
                    println!("FAILED {}: {e}", &h[..12]);
                }
                out.push(serde_json::json!({"hash": h, "ok": false, "error": e.to_string()}));
            }
        }
    }
    if implicit {
        let (bad, entries) = crate::runtimes::cli::verify_all(Some(cache.root()), format)?;
        failed += bad;
        out.extend(entries);
    }
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `voidbox image probe`.
fn probe(format: Format) -> Result<ExitCode, ImageError> {
    let r = kvm_probe::probe()?;
    let profile = profile_for(r.kind);
    // The image `apply`/`run` would boot here, and where it comes from (a CI cache
    // key); none yet means the first run builds (or pulls) it.
    let image =
        crate::sandbox::GuestImage::locate().map_err(|e| ImageError::Environment(e.to_string()))?;
    let source = |s| match s {
        crate::sandbox::ImageSource::Registry => "registry",
        crate::sandbox::ImageSource::Bundled => "bundled",
        crate::sandbox::ImageSource::Cached => "cache",
    };
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "kvm": r.kind.to_string(),
                "profile": profile,
                "image": image.as_ref().map(|(g, s)| serde_json::json!({
                    "hash": g.hash, "source": source(*s), "vmlinux": g.vmlinux,
                })),
                "cpl0_ns_per_instruction": r.cpl0_ns_per_insn,
                "loop_ms": r.loop_time.as_secs_f64() * 1e3,
                "popcnt_conclusive": r.popcnt_conclusive,
                "failed_instruction": r.failed_insn.as_ref().map(hex::encode),
            })
        ),
        Format::Human => {
            println!("{} → profile {profile} ({})", r.kind, describe_probe(&r));
            match &image {
                Some((g, s)) => println!("image {} ({})", g.hash, source(*s)),
                None => println!(
                    "no {profile} image yet: the first run builds it (`voidbox image build`)"
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn describe_probe(r: &kvm_probe::ProbeReport) -> String {
    let speed = format!(
        "guest kernel code ≈{:.0} ns/instruction",
        r.cpl0_ns_per_insn
    );
    match (r.kind, r.popcnt_conclusive) {
        (HostKvm::EmulatedKernelMode, true) => format!("{speed}; emulator rejected popcnt at CPL0"),
        (HostKvm::EmulatedKernelMode, false) => format!("{speed}; judged by loop timing"),
        (HostKvm::Hardware, _) => speed,
    }
}

fn info_json(info: &ImageInfo, runtimes: Option<&crate::runtimes::RuntimesDisk>) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "hash": info.hash,
        "dir": info.dir,
        "vmlinux": info.vmlinux,
        "system_disk": info.system_disk,
        "system_disk_size": info.manifest.system_disk.as_ref().map(|a| a.size),
        "agent": info.agent,
        "profile": info.profile,
        "kernel_release": info.kernel_release,
        "cmdline": info.cmdline,
        "freshly_built": info.freshly_built,
        "runtimes": runtimes.map(crate::runtimes::cli::disk_json),
    }))
    .unwrap_or_default()
}

/// `system-disk`, or `initramfs` for images of the old layout (never booted).
fn layout_name(m: &Manifest) -> &'static str {
    if m.is_current_layout() {
        "system-disk"
    } else {
        "initramfs"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(subcommand)]
            c: ImageCommand,
        }
        let t = T::try_parse_from(["x", "build", "--profile", "compat", "-j", "2"]).unwrap();
        assert!(matches!(
            t.c,
            ImageCommand::Build(BuildArgs {
                profile: ProfileChoice::Compat,
                jobs: Some(2),
                ..
            })
        ));
        assert!(
            T::try_parse_from(["x", "rm"]).is_err(),
            "rm needs hashes or --all"
        );
        assert!(T::try_parse_from(["x", "rm", "--all", "abc"]).is_err());
        assert!(T::try_parse_from(["x", "ls", "--format", "json"]).is_ok());
    }

    #[test]
    fn cli_parses_push_and_pull() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(subcommand)]
            c: ImageCommand,
        }
        let t = T::try_parse_from(["x", "push", "reg:5000/g:v1", "abc123", "--profile", "plain"])
            .unwrap();
        assert!(matches!(
            t.c,
            ImageCommand::Push { ref reference, hash: Some(ref h), profile: ProfileChoice::Plain, .. }
                if reference == "reg:5000/g:v1" && h == "abc123"
        ));
        let t = T::try_parse_from([
            "x",
            "pull",
            "reg:5000/g:v1",
            "--format",
            "json",
            "--insecure-registry",
            "reg:5000",
        ])
        .unwrap();
        assert!(matches!(
            t.c,
            ImageCommand::Pull { format: Format::Json, ref insecure_registries, .. }
                if insecure_registries == &["reg:5000"]
        ));
        assert!(T::try_parse_from(["x", "pull"]).is_err());
        assert!(T::try_parse_from(["x", "pull", "r", "--insecure-registry", "http://r"]).is_err());
    }
}
