//! The build pipeline: dependencies → content hash → (cached?) → kernel (cached
//! separately by its own inputs) → system disk → manifest → atomic install.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use super::cache::Cache;
use super::error::ImageError;
use super::kernel::{is_compile_step, KernelBuild, EXPECTED_COMPILE_STEPS};
use super::manifest::{
    content_hash, sha256_file, sha256_hex, Artifact, ImageInputs, KernelInputs, KernelManifest,
    Manifest, NamedHash, AGENT_FILE, CONFIG_FILE, FORMAT, MANIFEST_FILE, SYSTEM_DISK_FILE,
    VMLINUX_FILE,
};
use super::progress::Progress;
use super::recipe::{self, Profile};
use super::{busybox, deps, erofs, guest_agent, layout};

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// Profile (already resolved from `auto`).
    pub profile: Profile,
    /// The guest agent binary (already resolved).
    pub guest_agent: PathBuf,
    /// `make -j`.
    pub jobs: usize,
    /// Rebuild even if cached (kernel included).
    pub force: bool,
    /// Keep the kernel build tree under the cache's `tmp/`.
    pub keep_build_dir: bool,
}

/// A finished (or found) image.
#[derive(Debug, Clone)]
pub struct Built {
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Whether it was built now (false: found in the cache).
    pub fresh: bool,
}

const PHASES: usize = 4;

/// The kernel inputs of `profile` with this toolchain.
pub fn kernel_inputs(profile: Profile, tc: &deps::Toolchain) -> KernelInputs {
    KernelInputs {
        builder_version: recipe::BUILDER_VERSION,
        profile,
        source_package: format!(
            "{} {}",
            recipe::KERNEL_SOURCE_PACKAGE,
            tc.kernel_source_version
        ),
        compiler: tc.gcc.clone(),
        kcflags: profile.kcflags().map(str::to_string),
        fragments: named_hashes(profile.fragments()),
        patches: named_hashes(recipe::PATCHES.iter().copied()),
    }
}

fn named_hashes<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<NamedHash> {
    items
        .into_iter()
        .map(|(n, t)| NamedHash {
            name: n.to_string(),
            sha256: sha256_hex(t.as_bytes()),
        })
        .collect()
}

/// Whether kernel inputs recorded in a manifest come from this build's recipe: the same
/// builder version, config fragments, patches and `KCFLAGS` for their profile. (The Debian
/// source version and compiler are not compared: that needs the toolchain, and a cached
/// kernel built by another toolchain from the same recipe is the same kernel.) An image
/// from an older recipe — say, without a later compat patch — must not be used silently.
/// Why this voidbox never boots the image `m` describes (`None`: it is current). `image
/// ls`, `image verify` and `doctor` all say "stale" for exactly these.
pub fn stale_reason(m: &super::manifest::Manifest) -> Option<&'static str> {
    if !m.is_current_layout() {
        Some("old layout (kernel + initramfs)")
    } else if m.inputs.builder_version != recipe::BUILDER_VERSION {
        Some("made by another image builder")
    } else if !recipe_matches(&m.kernel_inputs) {
        Some("built from another kernel recipe (config fragments or patches)")
    } else if !busybox::at_least(&m.busybox_version, busybox::FIRST_FIXED) {
        Some("its busybox predates Debian's 1:1.36.1-5: `wget -T` crashes")
    } else {
        None
    }
}

/// Whether a kernel built from `k` is what this voidbox's recipe builds today.
pub fn recipe_matches(k: &KernelInputs) -> bool {
    k.builder_version == recipe::BUILDER_VERSION
        && k.kcflags.as_deref() == k.profile.kcflags()
        && k.fragments == named_hashes(k.profile.fragments())
        && k.patches == named_hashes(recipe::PATCHES.iter().copied())
}

/// Builds (or finds) the image for `req` in `cache`.
pub fn build(cache: &Cache, req: &BuildRequest, p: &mut Progress) -> Result<Built, ImageError> {
    let started = Instant::now();
    deps::ensure_packages(&mut |l| p.line(&format!("      {l}")))?;
    let busybox = busybox::ensure(cache, &mut |l| p.line(&format!("      {l}")))?;
    let tc = deps::toolchain(busybox)?;

    let kin = kernel_inputs(req.profile, &tc);
    let khash = content_hash(&kin);
    let agent_bytes = fs::read(&req.guest_agent).map_err(ImageError::io(&req.guest_agent))?;
    let busybox_bytes = fs::read(&tc.busybox).map_err(ImageError::io(&tc.busybox))?;
    let mock_llm = guest_agent::mock_llm_beside(&req.guest_agent);
    let mock_bytes = match &mock_llm {
        Some(m) => Some(fs::read(m).map_err(ImageError::io(m))?),
        None => None,
    };
    let inputs = ImageInputs {
        builder_version: recipe::BUILDER_VERSION,
        kernel_inputs_hash: khash.clone(),
        guest_agent_sha256: sha256_hex(&agent_bytes),
        mock_llm_sha256: mock_bytes.as_deref().map(sha256_hex),
        busybox_sha256: sha256_hex(&busybox_bytes),
        busybox_version: tc.busybox_version.clone(),
        strip: tc.strip.clone(),
        erofs_utils_version: Some(tc.erofs_utils_version.clone()),
    };
    let hash = content_hash(&inputs);
    let dest = cache.image_dir(&hash);
    if !req.force {
        if let Some(b) = cached(&dest)? {
            return Ok(b);
        }
    }
    let _lock = cache.lock(&hash, &mut || {
        p.line("      another build of this image is running; waiting for it")
    })?;
    if !req.force {
        if let Some(b) = cached(&dest)? {
            return Ok(b);
        }
    }
    p.line(&format!(
        "building guest image {} ({} profile, kernel {}) — this takes minutes when the kernel \
         is not cached yet (≈15 min on 2 cores)",
        &hash[..12],
        req.profile,
        &khash[..12]
    ));

    // Kernel, cached by its own inputs.
    let kdir = cache.kernel_dir(&khash);
    let kernel = {
        let _klock = cache.lock(&format!("kernel-{khash}"), &mut || {
            p.line("      another build of this kernel is running; waiting for it")
        })?;
        let reuse =
            !req.force && kdir.join(VMLINUX_FILE).is_file() && kdir.join("kernel.json").is_file();
        if reuse {
            p.phase(1, PHASES, "kernel: reusing the cached build");
            read_kernel_json(&kdir)?
        } else {
            build_kernel(cache, req, &tc, &kin, &khash, &kdir, p)?
        }
    };

    p.phase(3, PHASES, "building the system disk (erofs)");
    let tmp = cache.tmp_dir()?;
    let stage = tmp.join(format!("stage-{hash}"));
    let scratch = tmp.join(format!("scratch-{hash}"));
    for d in [&stage, &scratch] {
        if d.exists() {
            fs::remove_dir_all(d).map_err(ImageError::io(d))?;
        }
        fs::create_dir_all(d).map_err(ImageError::io(d))?;
    }
    let applets = layout::busybox_applets(&tc.busybox)?;
    let init_bytes = strip(&req.guest_agent, &agent_bytes, &scratch)?;
    let mut tree = layout::build(&init_bytes, &busybox_bytes, &applets)?;
    if let (Some(path), Some(bytes)) = (&mock_llm, &mock_bytes) {
        let stripped = strip(path, bytes, &scratch)?;
        layout::add_executable(&mut tree, guest_agent::MOCK_LLM_GUEST_PATH, &stripped)?;
    }
    let disk = stage.join(SYSTEM_DISK_FILE);
    erofs::build(&tree, &scratch, &disk)?;
    fs::remove_dir_all(&scratch).map_err(ImageError::io(&scratch))?;
    let agent_copy = stage.join(AGENT_FILE);
    fs::write(&agent_copy, &init_bytes).map_err(ImageError::io(&agent_copy))?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&agent_copy, fs::Permissions::from_mode(0o755))
            .map_err(ImageError::io(&agent_copy))?;
    }

    p.phase(4, PHASES, "installing into the cache");
    for name in [VMLINUX_FILE, CONFIG_FILE] {
        link_or_copy(&kdir.join(name), &stage.join(name))?;
    }
    let manifest = Manifest {
        format: FORMAT,
        hash: hash.clone(),
        profile: req.profile,
        cmdline: recipe::image_cmdline(req.profile),
        kernel: kernel.clone(),
        guest_agent_sha256: inputs.guest_agent_sha256.clone(),
        init_sha256: sha256_hex(&init_bytes),
        busybox_version: tc.busybox_version.clone(),
        vmlinux: Artifact::of(&stage, VMLINUX_FILE)?,
        initramfs: None,
        system_disk: Some(Artifact::of(&stage, SYSTEM_DISK_FILE)?),
        agent: Some(Artifact::of(&stage, AGENT_FILE)?),
        config: Artifact::of(&stage, CONFIG_FILE)?,
        inputs,
        kernel_inputs: kin,
        build_seconds: started.elapsed().as_secs_f64(),
        created_unix: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        path_programs: Some(layout::path_programs(&tree)),
    };
    let mpath = stage.join(MANIFEST_FILE);
    fs::write(&mpath, manifest.to_json() + "\n").map_err(ImageError::io(&mpath))?;
    if req.force && dest.exists() {
        super::cache::remove_dir_atomically(&dest, &cache.tmp_dir()?)?;
    }
    cache.install(&stage, &dest)?;
    Ok(Built {
        dir: dest,
        manifest,
        fresh: true,
    })
}

fn cached(dest: &Path) -> Result<Option<Built>, ImageError> {
    if !dest.join(MANIFEST_FILE).is_file() {
        return Ok(None);
    }
    let manifest = Manifest::load(dest)?;
    Ok(Some(Built {
        dir: dest.to_path_buf(),
        manifest,
        fresh: false,
    }))
}

fn build_kernel(
    cache: &Cache,
    req: &BuildRequest,
    tc: &deps::Toolchain,
    kin: &KernelInputs,
    khash: &str,
    kdir: &Path,
    p: &mut Progress,
) -> Result<KernelManifest, ImageError> {
    let t0 = Instant::now();
    let work = cache.tmp_dir()?.join(format!("build-{khash}"));
    if work.exists() {
        // Ours: we hold the kernel lock, so this is a leftover of a crashed build.
        fs::remove_dir_all(&work).map_err(ImageError::io(&work))?;
    }
    fs::create_dir_all(&work).map_err(ImageError::io(&work))?;
    let kb = KernelBuild {
        work: work.clone(),
        tarball: &tc.source_tarball,
        profile: req.profile,
        jobs: req.jobs,
        log: work.join("build.log"),
    };
    p.phase(
        1,
        PHASES,
        &format!(
            "kernel: unpacking {} {}, applying {} patches, configuring ({} profile)",
            recipe::KERNEL_SOURCE_PACKAGE,
            tc.kernel_source_version,
            recipe::PATCHES.len(),
            req.profile
        ),
    );
    kb.unpack()?;
    kb.patch()?;
    kb.configure()?;
    p.phase(
        2,
        PHASES,
        &format!(
            "kernel: compiling vmlinux with -j{} — this takes several minutes",
            req.jobs
        ),
    );
    p.start_compile(EXPECTED_COMPILE_STEPS);
    let built = kb.compile(&mut |l| {
        if is_compile_step(l) {
            p.compile_step(l);
        }
    })?;
    let config_sha256 = sha256_file(&built.config)?;
    let km = KernelManifest {
        release: built.release,
        source_package: kin.source_package.clone(),
        config_sha256,
        patches: recipe::PATCHES.iter().map(|(n, _)| n.to_string()).collect(),
        compiler: kin.compiler.clone(),
        kcflags: kin.kcflags.clone(),
        inputs_hash: khash.to_string(),
        build_seconds: t0.elapsed().as_secs_f64(),
    };
    p.line(&format!(
        "      kernel {} built in {:.0}s",
        km.release, km.build_seconds
    ));
    let kstage = cache.tmp_dir()?.join(format!("kstage-{khash}"));
    if kstage.exists() {
        fs::remove_dir_all(&kstage).map_err(ImageError::io(&kstage))?;
    }
    fs::create_dir_all(&kstage).map_err(ImageError::io(&kstage))?;
    for (from, to) in [
        (&built.vmlinux, VMLINUX_FILE),
        (&built.config, CONFIG_FILE),
        (&kb.log, "build.log"),
    ] {
        let dst = kstage.join(to);
        fs::copy(from, &dst).map_err(ImageError::io(&dst))?;
    }
    let kjson = kstage.join("kernel.json");
    fs::write(
        &kjson,
        serde_json::to_string_pretty(&km).unwrap_or_default(),
    )
    .map_err(ImageError::io(&kjson))?;
    if kdir.exists() {
        super::cache::remove_dir_atomically(kdir, &cache.tmp_dir()?)?;
    }
    cache.install(&kstage, kdir)?;
    if !req.keep_build_dir {
        fs::remove_dir_all(&work).map_err(ImageError::io(&work))?;
    } else {
        p.line(&format!("      kernel tree kept in {}", work.display()));
    }
    Ok(km)
}

fn read_kernel_json(kdir: &Path) -> Result<KernelManifest, ImageError> {
    let path = kdir.join("kernel.json");
    let text = fs::read_to_string(&path).map_err(ImageError::io(&path))?;
    let mut km: KernelManifest = serde_json::from_str(&text).map_err(|e| ImageError::Manifest {
        path,
        what: e.to_string(),
    })?;
    km.build_seconds = 0.0;
    Ok(km)
}

/// A program without symbols or debug info (line tables make the agent ~4× larger; the
/// guest reads every byte it runs from the system disk). Scripts are used as they are.
fn strip(agent: &Path, bytes: &[u8], scratch: &Path) -> Result<Vec<u8>, ImageError> {
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(bytes.to_vec());
    }
    let out = scratch.join("stripped");
    let res = std::process::Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&out)
        .arg(agent)
        .output()
        .map_err(|e| ImageError::Environment(format!("running strip: {e}")))?;
    if !res.status.success() {
        return Err(ImageError::Step {
            step: format!("strip --strip-all {}", agent.display()),
            log_tail: String::from_utf8_lossy(&res.stderr).into_owned(),
            log: None,
        });
    }
    let stripped = fs::read(&out).map_err(ImageError::io(&out))?;
    fs::remove_file(&out).map_err(ImageError::io(&out))?;
    Ok(stripped)
}

/// Hard-links `from` to `to`, copying when linking is not possible.
fn link_or_copy(from: &Path, to: &Path) -> Result<(), ImageError> {
    if fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    fs::copy(from, to).map(|_| ()).map_err(ImageError::io(to))
}

/// Resolves the guest agent for a build (see [`guest_agent::resolve`]).
pub fn resolve_agent(explicit: Option<&Path>, p: &Progress) -> Result<PathBuf, ImageError> {
    guest_agent::resolve(explicit, &mut |l| p.detail(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current(profile: Profile) -> KernelInputs {
        let tc = deps::Toolchain {
            kernel_source_version: "6.1.192-2".into(),
            gcc: "gcc (Debian 12.2.0-14) 12.2.0".into(),
            busybox_version: "1:1.35.0".into(),
            strip: "strip 2.40".into(),
            erofs_utils_version: "1.5-1".into(),
            source_tarball: "/usr/src/linux-source-6.1.tar.xz".into(),
            busybox: "/bin/busybox".into(),
        };
        kernel_inputs(profile, &tc)
    }

    #[test]
    fn only_images_from_this_recipe_are_used() {
        for profile in [Profile::Plain, Profile::Compat] {
            let mut k = current(profile);
            assert!(recipe_matches(&k), "{profile:?}");
            // Another toolchain, same recipe: the same kernel.
            k.compiler = "gcc 13".into();
            k.source_package = "linux-source-6.1 6.1.200-1".into();
            assert!(recipe_matches(&k));
            // An image built before the last patch existed.
            let mut old = current(profile);
            old.patches.pop();
            assert!(!recipe_matches(&old));
            // A patch whose text changed.
            let mut changed = current(profile);
            changed.patches[0].sha256 = sha256_hex(b"older text");
            assert!(!recipe_matches(&changed));
            let mut frag = current(profile);
            frag.fragments[0].sha256 = sha256_hex(b"CONFIG_OLD=y");
            assert!(!recipe_matches(&frag));
            let mut builder = current(profile);
            builder.builder_version += 1;
            assert!(!recipe_matches(&builder));
        }
    }
}
