//! The runtimes disk: a read-only erofs disk carrying the real agent CLIs into agent VMs
//! (issue 13, item 1), mounted at [`GUEST_MOUNT`].
//!
//! ```text
//! claude/bin/claude            Claude Code, the native musl build (npm
//!                              @anthropic-ai/claude-code-linux-x64-musl); its interpreter is
//!                              /lib/ld-musl-x86_64.so.1, a link on the system disk to
//! lib/ld-musl-x86_64.so.1      Debian musl's libc.so (the musl loader and libc)
//! bash/bin/bash                Debian's bash-static: the shell of Claude Code's Bash tool
//! codex/bin/codex              Codex, static musl (npm @openai/codex, linux-x64 build)
//! codex/bin/rg                 ripgrep from the same package (Codex looks it up on PATH)
//! manifest.json                packages, versions, tarball URLs, pinned integrities, the
//!                              SHA-256 of every file, the Debian versions — no host paths
//! ```
//!
//! Built from pinned packages ([`pins`]): each tarball is fetched from the npm registry
//! (`$VOIDBOX_NPM_REGISTRY`, default [`DEFAULT_REGISTRY`]) into a file, its SHA-512 checked
//! against the pinned integrity (never the registry's), and only the shipped entries are
//! taken from it ([`npm`]). Files are mode 0555, owned by root, timestamps 0: the same pins
//! and Debian packages give the same bytes.
//!
//! Cached by content in the image cache root (`~/.cache/voidbox`):
//! `runtimes/<key>/{runtimes.erofs,manifest.json}`, where the key is the SHA-256 over the
//! layout version, the pinned packages and the Debian packages' versions. A build holds the
//! cache's lock `locks/runtimes-<key>.lock`, works in `tmp/` and renames the finished
//! directory into place, so a concurrent build waits and then finds it cached.

pub mod cli;
mod disk;
mod error;
mod manifest;
mod npm;
mod pins;
#[cfg(test)]
mod tests;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

pub use disk::{read_back, sha256_file, Found, DIR_MODE, FILE_MODE, MANIFEST_MODE};
pub use error::RuntimesError;
pub use manifest::{
    DebianRecord, DiskRecord, FileRecord, Manifest, PackageRecord, DISK_FILE, MANIFEST_FILE,
};
pub use npm::{registry, tarball_url, DEFAULT_REGISTRY, REGISTRY_ENV};
pub use pins::{
    BASH_PACKAGE, BASH_PATH, BASH_STATIC, CLAUDE_INTEGRITY, CLAUDE_PACKAGE, CLAUDE_PATH,
    CLAUDE_VERSION, CODEX_INTEGRITY, CODEX_PACKAGE, CODEX_PATH, CODEX_VERSION, LOADER_PATH,
    MUSL_LIBC, MUSL_PACKAGE, RG_PATH,
};

use crate::image::cache::{is_hash, remove_dir_atomically};
use crate::image::Cache;
use pins::{DebianFile, Package};

/// Version of the disk's layout; part of the cache key.
pub const LAYOUT_VERSION: u32 = 2;
/// Where the guest mounts the disk (read-only).
pub const GUEST_MOUNT: &str = "/opt/voidbox/runtimes/npm";
/// Claude Code in the guest.
pub const CLAUDE_BIN: &str = "/opt/voidbox/runtimes/npm/claude/bin/claude";
/// Codex in the guest.
pub const CODEX_BIN: &str = "/opt/voidbox/runtimes/npm/codex/bin/codex";
/// ripgrep in the guest (Codex finds it on `PATH`: put [`CODEX_BIN_DIR`] there).
pub const RG_BIN: &str = "/opt/voidbox/runtimes/npm/codex/bin/rg";
/// Claude Code's directory in the guest, for `PATH`.
pub const CLAUDE_BIN_DIR: &str = "/opt/voidbox/runtimes/npm/claude/bin";
/// Codex's (and ripgrep's) directory in the guest, for `PATH`.
pub const CODEX_BIN_DIR: &str = "/opt/voidbox/runtimes/npm/codex/bin";
/// The musl loader in the guest: the target of the system disk's `/lib/ld-musl-x86_64.so.1`.
pub const LOADER_BIN: &str = "/opt/voidbox/runtimes/npm/lib/ld-musl-x86_64.so.1";
/// bash in the guest (Claude Code's `SHELL`).
pub const BASH_BIN: &str = "/opt/voidbox/runtimes/npm/bash/bin/bash";
/// bash's directory in the guest, for `PATH`.
pub const BASH_BIN_DIR: &str = "/opt/voidbox/runtimes/npm/bash/bin";
/// Directory of the runtimes disks in the cache root.
pub const CACHE_SUBDIR: &str = "runtimes";

/// A runtimes disk in the cache.
#[derive(Debug, Clone)]
pub struct RuntimesDisk {
    /// The erofs file (`…/runtimes/<key>/runtimes.erofs`).
    pub path: PathBuf,
    /// SHA-256 of the erofs file, hex (as recorded at build; `verify` re-hashes it).
    pub digest: String,
    /// What it holds (with its [`DiskRecord`]).
    pub manifest: Manifest,
    /// Whether this call built it.
    pub freshly_built: bool,
}

impl RuntimesDisk {
    /// Its cache key (the directory name).
    pub fn key(&self) -> &str {
        &self.manifest.key
    }

    /// Size of the erofs file in bytes.
    pub fn size(&self) -> u64 {
        self.manifest.disk.as_ref().map_or(0, |d| d.size)
    }

    /// `claude-code 2.1.330, codex 0.169.0-linux-x64, musl 1.2.3-1, bash-static 5.2.15-2`.
    pub fn versions(&self) -> String {
        let mut parts: Vec<String> = self
            .manifest
            .packages
            .iter()
            .map(|p| format!("{} {}", short_name(&p.name), p.version))
            .collect();
        parts.extend(
            self.manifest
                .debian
                .iter()
                .map(|d| format!("{} {}", d.package, d.version)),
        );
        parts.join(", ")
    }

    /// The disk as a VM gets it: read-only at [`GUEST_MOUNT`], checked by its digest.
    pub fn image_disk(&self) -> crate::sandbox::disks::ImageDisk {
        crate::sandbox::disks::ImageDisk {
            path: self.path.clone(),
            digest: format!("sha256:{}", self.digest),
            role: crate::sandbox::disks::DiskRole::Runtimes {
                mount: GUEST_MOUNT.into(),
            },
        }
    }
}

/// A short name for a package: `@anthropic-ai/claude-code-linux-x64-musl` → `claude-code`,
/// `@openai/codex` → `codex`.
pub fn short_name(package: &str) -> &str {
    let base = package.rsplit('/').next().unwrap_or(package);
    base.strip_suffix("-linux-x64-musl")
        .or_else(|| base.strip_suffix("-linux-x64"))
        .unwrap_or(base)
}

/// The cached runtimes disk of the pinned packages in the default cache, if there is one
/// (no network; `None` also when Debian's musl or bash-static is not installed, as their
/// versions are part of the key).
pub fn cached() -> Result<Option<RuntimesDisk>, RuntimesError> {
    cached_in(None)
}

/// [`cached`] in the cache rooted at `cache_root` (default: the image cache's root).
pub fn cached_in(cache_root: Option<&Path>) -> Result<Option<RuntimesDisk>, RuntimesError> {
    let cache = Cache::open(cache_root)?;
    let Ok(debian) = pins::host_files() else {
        return Ok(None);
    };
    load(&disk_dir(&cache, &pins::pinned(), &debian))
}

/// The runtimes disk of the pinned packages in the default cache: the cached one, or one
/// fetched and built now (about 335 MB from the registry; `log` gets a line per step).
/// An unreachable registry is [`RuntimesError::Registry`] naming the URL and the reason;
/// its [`RuntimesError::exit_code`] is 3, as for a missing Debian package.
pub fn ensure(log: &mut dyn FnMut(&str)) -> Result<RuntimesDisk, RuntimesError> {
    ensure_in(None, log)
}

/// [`ensure`] in the cache rooted at `cache_root` (default: the image cache's root).
pub fn ensure_in(
    cache_root: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<RuntimesDisk, RuntimesError> {
    let opts = Options {
        cache: Cache::open(cache_root)?,
        registry: npm::registry(),
        packages: pins::pinned(),
        debian: pins::host_files().map_err(RuntimesError::Environment)?,
    };
    ensure_with(&opts, log)
}

/// The cache key the pinned packages and this host's Debian files give, if installed.
pub fn current_key() -> Option<String> {
    let debian = pins::host_files().ok()?;
    Some(manifest::cache_key(&pins::pinned(), &debian))
}

/// Every runtimes disk in the cache rooted at `cache_root`, newest first, and the
/// directories that could not be read (with why).
pub fn list(cache_root: Option<&Path>) -> Result<Listing, RuntimesError> {
    let cache = Cache::open(cache_root)?;
    let dir = cache.root().join(CACHE_SUBDIR);
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
        Err(e) => return Err(RuntimesError::io(&dir)(e)),
    };
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for entry in rd.flatten() {
        let path = entry.path();
        if !entry.file_name().to_str().is_some_and(is_hash) {
            continue;
        }
        match load(&path) {
            Ok(Some(d)) => good.push(d),
            Ok(None) => {}
            Err(e) => bad.push((path, e)),
        }
    }
    let created = |d: &RuntimesDisk| d.manifest.disk.as_ref().map_or(0, |r| r.created_unix);
    good.sort_by(|a, b| {
        created(b)
            .cmp(&created(a))
            .then_with(|| a.key().cmp(b.key()))
    });
    Ok((good, bad))
}

/// Readable runtimes disks, and cache directories that could not be read (with why).
pub type Listing = (Vec<RuntimesDisk>, Vec<(PathBuf, RuntimesError)>);

/// What [`verify`] checked.
#[derive(Debug, Clone)]
pub struct VerifyReport {
    /// Entries on the disk (directories and files).
    pub entries: usize,
}

/// Re-hashes the erofs file against the recorded digest and size, then reads the disk back
/// (`fsck.erofs --extract` under `scratch`) and checks every file against the manifest:
/// present, mode 0555, size and SHA-256; the on-disk manifest equal to the cache's; nothing
/// else on it.
pub fn verify(disk: &RuntimesDisk, scratch: &Path) -> Result<VerifyReport, RuntimesError> {
    let fail = |problems: Vec<String>| RuntimesError::Verify {
        key: disk.key().to_string(),
        problems,
    };
    let (size, sha) = sha256_file(&disk.path)?;
    if sha != disk.digest || size != disk.size() {
        return Err(fail(vec![format!(
            "{}: sha256 {sha} ({size} bytes), recorded {} ({} bytes)",
            DISK_FILE,
            disk.digest,
            disk.size()
        )]));
    }
    let found = read_back(&disk.path, scratch).map_err(|e| fail(vec![e]))?;
    let mut problems = Vec::new();
    let mut expected: Vec<(String, u32, u64, String)> = disk
        .manifest
        .files()
        .map(|f| (f.path.clone(), FILE_MODE, f.size, f.sha256.clone()))
        .collect();
    let json = disk.manifest.on_disk().to_json();
    expected.push((
        MANIFEST_FILE.to_string(),
        MANIFEST_MODE,
        json.len() as u64,
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(json.as_bytes())),
    ));
    for (path, mode, size, sha) in &expected {
        match found.get(path) {
            None => problems.push(format!("{path}: missing")),
            Some(Found { file: None, .. }) => problems.push(format!("{path}: a directory")),
            Some(Found {
                mode: m,
                file: Some((s, h)),
            }) => {
                if m != mode {
                    problems.push(format!("{path}: mode {m:o}, expected {mode:o}"));
                }
                if s != size || h != sha {
                    problems.push(format!(
                        "{path}: sha256 {h} ({s} bytes), manifest says {sha} ({size} bytes)"
                    ));
                }
            }
        }
    }
    for (path, f) in &found {
        match f.file {
            None if f.mode != DIR_MODE => {
                problems.push(format!("{path}/: mode {:o}, expected {DIR_MODE:o}", f.mode))
            }
            Some(_) if !expected.iter().any(|e| &e.0 == path) => {
                problems.push(format!("{path}: not in the manifest"))
            }
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(VerifyReport {
            entries: found.len(),
        })
    } else {
        Err(fail(problems))
    }
}

/// What a build uses: injectable so tests can pin their own packages and registry.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The cache (its root, `tmp/`, `locks/`).
    pub cache: Cache,
    /// Registry base URL (no trailing `/`).
    pub registry: String,
    /// Packages to ship.
    pub packages: Vec<Package>,
    /// The Debian files.
    pub debian: Vec<DebianFile>,
}

/// `runtimes/<key>/` for these inputs.
fn disk_dir(cache: &Cache, packages: &[Package], debian: &[DebianFile]) -> PathBuf {
    cache
        .root()
        .join(CACHE_SUBDIR)
        .join(manifest::cache_key(packages, debian))
}

/// The disk cached in `dir`: `None` if `dir` does not exist; an error if it is not a
/// complete entry (a manifest that does not parse or name its directory, an erofs file of
/// another size than recorded).
fn load(dir: &Path) -> Result<Option<RuntimesDisk>, RuntimesError> {
    if !dir.exists() {
        return Ok(None);
    }
    let m = Manifest::load(dir)?;
    let bad = |what: &str| RuntimesError::Manifest {
        path: dir.join(MANIFEST_FILE),
        what: what.to_string(),
    };
    if dir.file_name().and_then(|n| n.to_str()) != Some(m.key.as_str()) {
        return Err(bad("its key differs from the directory name"));
    }
    let Some(d) = m.disk.as_ref() else {
        return Err(bad("no disk record"));
    };
    if d.file != DISK_FILE {
        return Err(bad("the disk record names another file"));
    }
    let path = dir.join(DISK_FILE);
    let len = fs::metadata(&path).map_err(RuntimesError::io(&path))?.len();
    if len != d.size {
        return Err(bad(&format!(
            "{DISK_FILE} is {len} bytes, {} recorded",
            d.size
        )));
    }
    Ok(Some(RuntimesDisk {
        path,
        digest: d.sha256.clone(),
        manifest: m,
        freshly_built: false,
    }))
}

/// [`ensure_in`] with explicit inputs.
pub(crate) fn ensure_with(
    opts: &Options,
    log: &mut dyn FnMut(&str),
) -> Result<RuntimesDisk, RuntimesError> {
    let key = manifest::cache_key(&opts.packages, &opts.debian);
    let dir = opts.cache.root().join(CACHE_SUBDIR).join(&key);
    if let Ok(Some(d)) = load(&dir) {
        return Ok(d);
    }
    let _lock = opts.cache.lock(&format!("runtimes-{key}"), &mut || {
        log("waiting for another process building the runtimes disk")
    })?;
    match load(&dir) {
        Ok(Some(d)) => return Ok(d),
        Ok(None) => {}
        Err(e) => {
            log(&format!("replacing an unusable runtimes disk: {e}"));
            remove_dir_atomically(&dir, &opts.cache.tmp_dir()?)?;
        }
    }
    let started = Instant::now();
    let tmp = opts.cache.tmp_dir()?;
    let staging = tempfile::Builder::new()
        .prefix("runtimes-")
        .tempdir_in(&tmp)
        .map_err(RuntimesError::io(&tmp))?;
    let (tree, out) = (staging.path().join("tree"), staging.path().join("out"));
    for d in [&tree, &out] {
        fs::create_dir(d).map_err(RuntimesError::io(d))?;
    }
    disk::make_parents(
        &tree,
        opts.packages
            .iter()
            .flat_map(|p| p.files.iter().map(|f| f.dest.as_str()))
            .chain(opts.debian.iter().map(|d| d.dest)),
    )?;

    let client = npm::client()?;
    let mut packages = Vec::new();
    for pkg in &opts.packages {
        let url = tarball_url(&opts.registry, &pkg.name, &pkg.version);
        log(&format!("fetching {} from {url}", pkg.id()));
        let tgz = staging.path().join("package.tgz");
        let digest = npm::download(&client, &url, &tgz)?;
        npm::check_integrity(pkg, &url, &digest)?;
        let files = npm::extract(pkg, &tgz, &tree)?;
        fs::remove_file(&tgz).map_err(RuntimesError::io(&tgz))?;
        for f in &files {
            log(&format!(
                "  {} ({})",
                f.path,
                crate::units::human_size(f.size)
            ));
        }
        packages.push(PackageRecord {
            name: pkg.name.clone(),
            version: pkg.version.clone(),
            tarball: tarball_url(DEFAULT_REGISTRY, &pkg.name, &pkg.version),
            integrity: pkg.integrity.clone(),
            files,
        });
    }

    let mut debian = Vec::new();
    for d in &opts.debian {
        let dest = tree.join(d.dest);
        let (size, sha256) = npm::copy_hashed(
            File::open(&d.path).map_err(RuntimesError::io(&d.path))?,
            &dest,
        )
        .map_err(RuntimesError::io(&dest))?;
        debian.push(DebianRecord {
            package: d.package.to_string(),
            version: d.version.clone(),
            file: FileRecord {
                path: d.dest.to_string(),
                source: d.path.to_string_lossy().trim_start_matches('/').to_string(),
                size,
                sha256,
            },
        });
    }
    let mut manifest = Manifest {
        layout: LAYOUT_VERSION,
        key: key.clone(),
        mount: GUEST_MOUNT.to_string(),
        packages,
        debian,
        disk: None,
    };
    let inner = tree.join(MANIFEST_FILE);
    fs::write(&inner, manifest.to_json()).map_err(RuntimesError::io(&inner))?;
    disk::set_modes(&tree)?;

    log("packing the runtimes disk (mkfs.erofs)");
    let erofs = out.join(DISK_FILE);
    disk::pack(&tree, &erofs)?;
    let (size, sha256) = sha256_file(&erofs)?;
    manifest.disk = Some(DiskRecord {
        file: DISK_FILE.to_string(),
        size,
        sha256,
        created_unix: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        build_seconds: started.elapsed().as_secs_f64(),
    });
    let outer = out.join(MANIFEST_FILE);
    fs::write(&outer, manifest.to_json()).map_err(RuntimesError::io(&outer))?;
    opts.cache.install(&out, &dir)?;
    let mut d = load(&dir)?.ok_or_else(|| RuntimesError::Manifest {
        path: dir.join(MANIFEST_FILE),
        what: "missing right after it was installed".into(),
    })?;
    d.freshly_built = true;
    Ok(d)
}
