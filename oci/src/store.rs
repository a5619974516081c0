//! The content-addressed image cache and the pull pipeline.
//!
//! Layout under the cache root:
//! ```text
//! images/<hex>/rootfs.erofs        the read-only root filesystem (<hex>: manifest digest)
//! images/<hex>/image.json          digest, layer count, runtime config, sizes
//! images/<hex>/boot/kernel         guest-image kernel, when the image has one
//! images/<hex>/boot/initramfs.cpio guest-image initramfs (decompressed), when it has one
//! images/<hex>/last_used           its mtime is the last use (LRU)
//! refs/<sha256 of reference>.json  last resolution of a reference: {reference, manifest_digest}
//! locks/<hex>.lock                 flock'ed while an image is built or removed
//! tmp/                             builds in progress; renamed into images/ when complete
//! ```
//! An image directory appears by `rename` only when complete, so nothing half-written is ever
//! visible; leftovers of a killed build are removed by the next pull of the same digest.

use crate::boot::{self, INITRAMFS_FILE, KERNEL_FILE, KERNEL_PATHS};
use crate::config::{resolve_user, RuntimeConfig};
use crate::erofs::make_erofs;
use crate::error::{IoContext, OciError};
use crate::options::{PullOptions, PullProgress};
use crate::pull::{Remote, Resolved};
use crate::reference::{Digest, ImageRef};
use crate::resolve::Root;
use crate::unpack::{Compression, Unpacker};
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Layers downloaded at the same time.
const PARALLEL_DOWNLOADS: usize = 3;
/// Version of `image.json`.
const RECORD_FORMAT: u32 = 1;

/// The OCI image cache (see the module docs for its layout).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// An image ready to boot: its erofs root filesystem and runtime config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// The reference as given.
    pub reference: String,
    /// Digest of the platform-specific image manifest (`sha256:…`), the cache key.
    pub manifest_digest: String,
    /// The read-only erofs disk holding the root filesystem.
    pub rootfs_disk: PathBuf,
    /// Size of `rootfs_disk` in bytes.
    pub disk_bytes: u64,
    /// Number of layers the image has.
    pub layers: usize,
    /// `Env`, `WorkingDir`, `User` (resolved), `Entrypoint`, `Cmd`.
    pub config: RuntimeConfig,
    /// Whether the image came from the cache (nothing downloaded or converted).
    pub cache_hit: bool,
}

/// Kernel and initramfs of a void-box guest image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFiles {
    /// Digest of the image manifest they came from.
    pub manifest_digest: String,
    /// The kernel (copied out of the image).
    pub kernel: PathBuf,
    /// The initramfs as a plain (uncompressed) cpio archive, when the image has one.
    pub initramfs: Option<PathBuf>,
}

/// One cached image, for listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// References whose last resolution was this image (fully qualified).
    pub references: Vec<String>,
    /// The erofs disk.
    pub rootfs_disk: PathBuf,
    /// Bytes the image takes in the cache (disk, boot files, metadata).
    pub bytes: u64,
    /// Number of layers.
    pub layers: usize,
    /// Whether the image holds a guest kernel.
    pub has_kernel: bool,
    /// When it was pulled.
    pub created: SystemTime,
    /// When it was last pulled or looked up.
    pub last_used: SystemTime,
}

#[derive(Debug, Serialize, Deserialize)]
struct ImageRecord {
    format: u32,
    manifest_digest: String,
    index_digest: Option<String>,
    layers: usize,
    config: RuntimeConfig,
    created_unix: u64,
    disk_bytes: u64,
    kernel: bool,
    initramfs: bool,
    /// `os/architecture` of the image config (empty when it says nothing).
    #[serde(default)]
    platform: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct RefRecord {
    reference: String,
    manifest_digest: String,
}

/// An exclusive `flock` on a digest's lock file; released on drop.
struct DigestLock(#[allow(dead_code)] std::fs::File);

impl Store {
    /// The default cache root: `$XDG_CACHE_HOME/voidbox/oci`, else `~/.cache/voidbox/oci`.
    pub fn default_root() -> Result<PathBuf, OciError> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })
            .ok_or_else(|| OciError::Cache {
                path: PathBuf::from("~/.cache"),
                reason: "neither XDG_CACHE_HOME nor HOME is set".into(),
            })?;
        Ok(base.join("voidbox").join("oci"))
    }

    /// Opens (creating) the cache at [`Store::default_root`].
    pub fn open_default() -> Result<Store, OciError> {
        Store::open(Store::default_root()?)
    }

    /// Opens (creating) the cache at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store, OciError> {
        let store = Store { root: root.into() };
        for dir in ["images", "refs", "locks", "tmp"] {
            let p = store.root.join(dir);
            std::fs::create_dir_all(&p).ctx(|| format!("creating {}", p.display()))?;
        }
        Ok(store)
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Pulls `reference` (tag or digest) and returns its erofs disk, building it if needed.
    ///
    /// A digest reference already cached is served without touching the network. A tag is
    /// resolved against the registry every time, so a tag that moved is pulled again; the
    /// resulting manifest digest is served from the cache when present. Concurrent pulls of
    /// one image (in this process or others) wait for each other, and all but the first
    /// return `cache_hit: true`.
    pub async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &dyn PullProgress,
    ) -> Result<PulledImage, OciError> {
        let image = ImageRef::parse(reference)?;
        if image.digest().is_some() {
            if let Some(hit) = self.lookup_ref(&image)? {
                progress.phase("cached");
                return Ok(hit);
            }
        }
        progress.phase("resolving");
        let remote = Remote::connect(&image, opts).await?;
        let resolved = remote.resolve(&opts.platform).await?;
        let digest = resolved.manifest_digest.clone();
        self.check_platform(&image, &digest, opts)?;
        if let Some(hit) = self.hit(&image, &digest)? {
            progress.phase("cached");
            return Ok(hit);
        }
        let lock = self.lock(&digest).await?;
        self.check_platform(&image, &digest, opts)?;
        if let Some(hit) = self.hit(&image, &digest)? {
            progress.phase("cached");
            return Ok(hit);
        }
        self.build(&remote, &resolved, opts, progress).await?;
        self.write_ref(&image, &digest)?;
        drop(lock);
        let mut pulled = self
            .pulled(&image, &digest)?
            .ok_or_else(|| OciError::Cache {
                path: self.image_dir(&digest),
                reason: "image vanished right after it was built".into(),
            })?;
        pulled.cache_hit = false;
        Ok(pulled)
    }

    /// The cached image for `reference`, without network: a digest reference is looked up
    /// directly, a tag by its last resolution. `None` when not cached.
    pub fn lookup(&self, reference: &str) -> Result<Option<PulledImage>, OciError> {
        self.lookup_ref(&ImageRef::parse(reference)?)
    }

    /// Pulls `reference` and returns the kernel and initramfs it holds (void-box guest-image
    /// layout, see [`crate::boot`]); an image without a kernel is an error listing the paths
    /// looked at.
    pub async fn pull_boot_files(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &dyn PullProgress,
    ) -> Result<BootFiles, OciError> {
        let pulled = self.pull(reference, opts, progress).await?;
        let digest = Digest::parse(&pulled.manifest_digest).map_err(|reason| OciError::Cache {
            path: self.root.clone(),
            reason,
        })?;
        let record = self
            .record(&digest)?
            .ok_or_else(|| OciError::NotCached(pulled.manifest_digest.clone()))?;
        let dir = self.image_dir(&digest);
        if !record.kernel {
            return Err(OciError::NoKernel {
                reference: reference.to_string(),
                looked_at: KERNEL_PATHS.iter().map(|s| s.to_string()).collect(),
            });
        }
        Ok(BootFiles {
            manifest_digest: pulled.manifest_digest,
            kernel: dir.join(KERNEL_FILE),
            initramfs: record.initramfs.then(|| dir.join(INITRAMFS_FILE)),
        })
    }

    /// Every cached image, most recently used first.
    pub fn list(&self) -> Result<Vec<CachedImage>, OciError> {
        let refs = self.read_refs()?;
        let mut out = Vec::new();
        let images = self.root.join("images");
        for ent in std::fs::read_dir(&images).ctx(|| format!("listing {}", images.display()))? {
            let ent = ent.ctx(|| format!("listing {}", images.display()))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            let Ok(digest) = Digest::parse(&format!("sha256:{name}")) else {
                continue;
            };
            let Some(record) = self.record(&digest)? else {
                continue;
            };
            let dir = self.image_dir(&digest);
            let created = UNIX_EPOCH + Duration::from_secs(record.created_unix);
            let last_used = std::fs::metadata(dir.join("last_used"))
                .and_then(|m| m.modified())
                .unwrap_or(created);
            let mut references: Vec<String> = refs
                .iter()
                .filter(|(_, r)| r.manifest_digest == digest.as_str())
                .map(|(_, r)| r.reference.clone())
                .collect();
            references.sort();
            out.push(CachedImage {
                manifest_digest: digest.to_string(),
                references,
                rootfs_disk: dir.join("rootfs.erofs"),
                bytes: dir_bytes(&dir),
                layers: record.layers,
                has_kernel: record.kernel,
                created,
                last_used,
            });
        }
        out.sort_by_key(|c| std::cmp::Reverse(c.last_used));
        Ok(out)
    }

    /// Removes what `what` names: a reference (its last resolution), or a digest or digest
    /// prefix (`sha256:ab12…` or `ab12…`, at least 4 hex digits). Returns what was removed;
    /// nothing matching is [`OciError::NotCached`], a prefix matching several images is
    /// [`OciError::Ambiguous`].
    pub fn remove(&self, what: &str) -> Result<Vec<CachedImage>, OciError> {
        let all = self.list()?;
        let digest = self.resolve_what(what, &all)?;
        let victims: Vec<CachedImage> = all
            .into_iter()
            .filter(|c| c.manifest_digest == digest.as_str())
            .collect();
        let _lock = self.lock_blocking(&digest)?;
        self.delete_image(&digest)?;
        Ok(victims)
    }

    /// Evicts least recently used images until the cache holds at most `max_bytes`; images
    /// being built or removed right now are skipped. Returns what was evicted.
    pub fn prune(&self, max_bytes: u64) -> Result<Vec<CachedImage>, OciError> {
        let mut all = self.list()?;
        all.sort_by_key(|c| c.last_used);
        let mut total: u64 = all.iter().map(|c| c.bytes).sum();
        let mut evicted = Vec::new();
        for img in all {
            if total <= max_bytes {
                break;
            }
            let Ok(digest) = Digest::parse(&img.manifest_digest) else {
                continue;
            };
            let Some(_lock) = self.try_lock(&digest)? else {
                continue;
            };
            self.delete_image(&digest)?;
            total = total.saturating_sub(img.bytes);
            evicted.push(img);
        }
        Ok(evicted)
    }

    // ---- pipeline ----

    async fn build(
        &self,
        remote: &Remote,
        resolved: &Resolved,
        opts: &PullOptions,
        progress: &dyn PullProgress,
    ) -> Result<(), OciError> {
        let digest = &resolved.manifest_digest;
        self.clean_tmp(digest);
        let tmp = self.root.join("tmp");
        let work = tempfile::Builder::new()
            .prefix(&format!("{}.", digest.hex()))
            .tempdir_in(&tmp)
            .ctx(|| format!("creating a build directory in {}", tmp.display()))?;
        let result = self
            .build_in(work.path(), remote, resolved, opts, progress)
            .await;
        // Removing a large tree blocks; do it off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(work)).await;
        result
    }

    async fn build_in(
        &self,
        work: &Path,
        remote: &Remote,
        resolved: &Resolved,
        opts: &PullOptions,
        progress: &dyn PullProgress,
    ) -> Result<(), OciError> {
        let digest = resolved.manifest_digest.clone();
        let mut layers = Vec::new();
        for l in resolved.manifest.layers() {
            let media_type = l.media_type().to_string();
            let compression = Compression::from_media_type(&media_type).ok_or_else(|| {
                OciError::UnsupportedMediaType {
                    media_type: media_type.clone(),
                    what: format!("layer {}", l.digest()),
                }
            })?;
            let d = Digest::parse(l.digest().as_ref()).map_err(|reason| OciError::Registry {
                registry: remote.image().registry().to_string(),
                reason,
            })?;
            layers.push((d, l.size(), compression, media_type));
        }
        let image_config = remote.config(&resolved.manifest).await?;
        let (os, arch) = (
            image_config.os().to_string(),
            image_config.architecture().to_string(),
        );
        if !os.is_empty() && !arch.is_empty() && !opts.platform.matches(&os, &arch, None) {
            return Err(OciError::NoMatchingPlatform {
                reference: remote.image().given().to_string(),
                platform: opts.platform.to_string(),
                available: format!("{os}/{arch}"),
            });
        }
        let mut config = RuntimeConfig::from_image_config(&image_config);

        progress.layers(layers.len(), layers.iter().map(|l| l.1).sum());
        progress.phase("downloading");
        // Owned items: a closure over borrowed ones makes the future not `Send`.
        futures_util::stream::iter(layers.clone().into_iter().enumerate())
            .map(|(i, (d, size, _, media_type))| async move {
                let dest = work.join(format!("layer-{i}"));
                remote
                    .blob_to_file(&media_type, &d, size, &dest, progress)
                    .await?;
                progress.layer_done(d.as_str());
                Ok::<(), OciError>(())
            })
            .buffer_unordered(PARALLEL_DOWNLOADS)
            .try_collect::<Vec<()>>()
            .await?;

        progress.phase("unpacking");
        let rootfs = work.join("rootfs");
        let out = work.join("image");
        for d in [&rootfs, &out] {
            std::fs::create_dir(d).ctx(|| format!("creating {}", d.display()))?;
        }
        let (work_c, rootfs_c, out_c) = (work.to_path_buf(), rootfs.clone(), out.clone());
        let plan: Vec<(Digest, Compression)> = layers.iter().map(|l| (l.0.clone(), l.2)).collect();
        let user = config.user.clone();
        let (unpacked, resolved_user, (kernel, initramfs)) = blocking(move || {
            let mut u = Unpacker::new(&rootfs_c)?;
            for (i, (d, compression)) in plan.iter().enumerate() {
                let path = work_c.join(format!("layer-{i}"));
                let f = std::fs::File::open(&path).ctx(|| format!("opening {}", path.display()))?;
                u.apply(
                    std::io::BufReader::with_capacity(1 << 20, f),
                    *compression,
                    d.as_str(),
                )?;
                let _ = std::fs::remove_file(&path);
            }
            let unpacked = u.finish();
            let root = Root::open(&rootfs_c).ctx(|| format!("opening {}", rootfs_c.display()))?;
            let resolved_user = user.as_deref().and_then(|u| resolve_user(&root, u));
            let boot = boot::extract(&root, &out_c)?;
            Ok((unpacked, resolved_user, boot))
        })
        .await?;
        config.resolved_user = resolved_user;

        progress.phase("converting");
        let disk = out.join("rootfs.erofs");
        let (disk_c, work_c) = (disk.clone(), work.to_path_buf());
        blocking(move || make_erofs(&unpacked, &disk_c, &work_c)).await?;
        let disk_bytes = std::fs::metadata(&disk)
            .ctx(|| format!("stat {}", disk.display()))?
            .len();

        let record = ImageRecord {
            format: RECORD_FORMAT,
            manifest_digest: digest.to_string(),
            index_digest: resolved.index_digest.as_ref().map(|d| d.to_string()),
            layers: layers.len(),
            config,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            disk_bytes,
            kernel,
            initramfs,
            platform: if os.is_empty() || arch.is_empty() {
                String::new()
            } else {
                format!("{os}/{arch}")
            },
        };
        write_json(&out.join("image.json"), &record)?;
        std::fs::write(out.join("last_used"), b"").ctx(|| format!("writing {}", out.display()))?;
        let dest = self.image_dir(&digest);
        std::fs::rename(&out, &dest).ctx(|| format!("moving the image into {}", dest.display()))
    }

    // ---- cache records ----

    fn image_dir(&self, digest: &Digest) -> PathBuf {
        self.root.join("images").join(digest.hex())
    }

    fn ref_path(&self, canonical: &str) -> PathBuf {
        self.root
            .join("refs")
            .join(format!("{}.json", Digest::of(canonical.as_bytes()).hex()))
    }

    fn record(&self, digest: &Digest) -> Result<Option<ImageRecord>, OciError> {
        let path = self.image_dir(digest).join("image.json");
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(OciError::io(format!("reading {}", path.display()), e)),
        };
        let record: ImageRecord = serde_json::from_slice(&text).map_err(|e| OciError::Cache {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if record.format != RECORD_FORMAT || record.manifest_digest != digest.as_str() {
            return Err(OciError::Cache {
                path,
                reason: "written by another version or for another digest; remove it".into(),
            });
        }
        Ok(Some(record))
    }

    /// A cached image built for another platform than `opts` asks for is refused, as it
    /// would be when pulled afresh.
    fn check_platform(
        &self,
        image: &ImageRef,
        digest: &Digest,
        opts: &PullOptions,
    ) -> Result<(), OciError> {
        let Some(record) = self.record(digest)? else {
            return Ok(());
        };
        if let Some((os, arch)) = record.platform.split_once('/') {
            if !opts.platform.matches(os, arch, None) {
                return Err(OciError::NoMatchingPlatform {
                    reference: image.given().to_string(),
                    platform: opts.platform.to_string(),
                    available: record.platform,
                });
            }
        }
        Ok(())
    }

    /// The cached image `digest` as a [`PulledImage`] for `image` (marking it used).
    fn pulled(&self, image: &ImageRef, digest: &Digest) -> Result<Option<PulledImage>, OciError> {
        let Some(record) = self.record(digest)? else {
            return Ok(None);
        };
        let dir = self.image_dir(digest);
        touch(&dir.join("last_used"));
        Ok(Some(PulledImage {
            reference: image.given().to_string(),
            manifest_digest: record.manifest_digest,
            rootfs_disk: dir.join("rootfs.erofs"),
            disk_bytes: record.disk_bytes,
            layers: record.layers,
            config: record.config,
            cache_hit: true,
        }))
    }

    /// A cache hit for `image` resolved to `digest`, recording the resolution.
    fn hit(&self, image: &ImageRef, digest: &Digest) -> Result<Option<PulledImage>, OciError> {
        let hit = self.pulled(image, digest)?;
        if hit.is_some() {
            self.write_ref(image, digest)?;
        }
        Ok(hit)
    }

    fn lookup_ref(&self, image: &ImageRef) -> Result<Option<PulledImage>, OciError> {
        if let Some(d) = image.digest() {
            if let Some(hit) = self.pulled(image, &d)? {
                return Ok(Some(hit));
            }
        }
        match self.read_ref(&image.canonical())? {
            Some(d) => self.pulled(image, &d),
            None => Ok(None),
        }
    }

    fn read_ref(&self, canonical: &str) -> Result<Option<Digest>, OciError> {
        let path = self.ref_path(canonical);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(OciError::io(format!("reading {}", path.display()), e)),
        };
        let bad = |reason: String| OciError::Cache {
            path: path.clone(),
            reason,
        };
        let r: RefRecord = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if r.reference != canonical {
            return Ok(None);
        }
        Digest::parse(&r.manifest_digest).map(Some).map_err(bad)
    }

    fn write_ref(&self, image: &ImageRef, digest: &Digest) -> Result<(), OciError> {
        let canonical = image.canonical();
        let record = RefRecord {
            reference: canonical.clone(),
            manifest_digest: digest.to_string(),
        };
        write_json(&self.ref_path(&canonical), &record)
    }

    fn read_refs(&self) -> Result<Vec<(PathBuf, RefRecord)>, OciError> {
        let dir = self.root.join("refs");
        let mut out = Vec::new();
        for ent in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let path = ent.ctx(|| format!("listing {}", dir.display()))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Some(r) = std::fs::read(&path)
                    .ok()
                    .and_then(|t| serde_json::from_slice(&t).ok())
                {
                    out.push((path, r));
                }
            }
        }
        Ok(out)
    }

    /// The single image `what` names (see [`Store::remove`]).
    fn resolve_what(&self, what: &str, all: &[CachedImage]) -> Result<Digest, OciError> {
        let what = what.trim();
        let prefix = what.strip_prefix("sha256:");
        if prefix.is_none() {
            if let Ok(image) = ImageRef::parse(what) {
                if let Some(d) = self.read_ref(&image.canonical())? {
                    return Ok(d);
                }
                if let Some(d) = image.digest() {
                    if all.iter().any(|c| c.manifest_digest == d.as_str()) {
                        return Ok(d);
                    }
                }
            }
        }
        let hex = prefix.unwrap_or(what);
        let is_hex =
            hex.len() >= 4 && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_hex {
            return Err(OciError::NotCached(what.to_string()));
        }
        let hex = hex.to_ascii_lowercase();
        let matches: Vec<&CachedImage> = all
            .iter()
            .filter(|c| c.manifest_digest["sha256:".len()..].starts_with(&hex))
            .collect();
        match matches.as_slice() {
            [] => Err(OciError::NotCached(what.to_string())),
            [one] => Digest::parse(&one.manifest_digest).map_err(|reason| OciError::Cache {
                path: self.root.clone(),
                reason,
            }),
            many => Err(OciError::Ambiguous {
                what: what.to_string(),
                count: many.len(),
            }),
        }
    }

    /// Deletes an image (caller holds its lock) and the references resolving to it.
    fn delete_image(&self, digest: &Digest) -> Result<(), OciError> {
        let dir = self.image_dir(digest);
        if dir.exists() {
            let grave = self.root.join("tmp").join(format!(
                "{}.removing.{}.{}",
                digest.hex(),
                std::process::id(),
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ));
            std::fs::rename(&dir, &grave).ctx(|| format!("removing {}", dir.display()))?;
            std::fs::remove_dir_all(&grave).ctx(|| format!("removing {}", grave.display()))?;
        }
        for (path, r) in self.read_refs()? {
            if r.manifest_digest == digest.as_str() {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(())
    }

    /// Removes leftovers of earlier builds of `digest` (caller holds its lock).
    fn clean_tmp(&self, digest: &Digest) {
        let tmp = self.root.join("tmp");
        let prefix = format!("{}.", digest.hex());
        if let Ok(rd) = std::fs::read_dir(&tmp) {
            for ent in rd.flatten() {
                if ent.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_dir_all(ent.path());
                }
            }
        }
    }

    // ---- locks ----

    fn lock_file(&self, digest: &Digest) -> Result<std::fs::File, OciError> {
        let path = self
            .root
            .join("locks")
            .join(format!("{}.lock", digest.hex()));
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx(|| format!("opening {}", path.display()))
    }

    async fn lock(&self, digest: &Digest) -> Result<DigestLock, OciError> {
        let file = self.lock_file(digest)?;
        blocking(move || {
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
                .ctx(|| "locking the image".to_string())?;
            Ok(DigestLock(file))
        })
        .await
    }

    fn lock_blocking(&self, digest: &Digest) -> Result<DigestLock, OciError> {
        let file = self.lock_file(digest)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .ctx(|| "locking the image".to_string())?;
        Ok(DigestLock(file))
    }

    fn try_lock(&self, digest: &Digest) -> Result<Option<DigestLock>, OciError> {
        let file = self.lock_file(digest)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(DigestLock(file))),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(OciError::io("locking the image", e.into())),
        }
    }
}

/// Runs blocking work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| OciError::io("background task", std::io::Error::other(e.to_string())))?
}

/// Writes JSON atomically (temp file + rename in the same directory).
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), OciError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp =
        tempfile::NamedTempFile::new_in(dir).ctx(|| format!("writing into {}", dir.display()))?;
    serde_json::to_writer_pretty(tmp.as_file(), value)
        .map_err(|e| OciError::io(format!("writing {}", path.display()), e.into()))?;
    tmp.persist(path)
        .map_err(|e| OciError::io(format!("writing {}", path.display()), e.error))?;
    Ok(())
}

fn touch(path: &Path) {
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Total size of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for ent in rd.flatten() {
            match ent.metadata() {
                Ok(m) if m.is_dir() => stack.push(ent.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
