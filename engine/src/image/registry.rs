//! Guest images as OCI artifacts: `voidbox image push|pull`, the ref → registry digest →
//! image hash index under the cache, and [`GUEST_IMAGE_ENV`] (`VOIDBOX_GUEST_IMAGE`).
//!
//! A team builds the guest image once, pushes it to its registry, and every CI runner pulls
//! it instead of compiling a kernel. The artifact is an OCI image manifest with
//! `artifactType` [`ARTIFACT_TYPE`], a config blob ([`CONFIG_MEDIA_TYPE`], a
//! [`GuestImageConfig`]) and one layer per file of the image directory ([`LAYERS`]: vmlinux,
//! system.erofs, voidbox-agent, config, manifest.json), each with its own media type and an
//! `org.opencontainers.image.title` annotation naming the file.
//!
//! A pull trusts nothing it downloads: the manifest is bounded and must be this artifact
//! type with exactly the expected layers, each layer's declared size is bounded before it
//! is fetched, each blob streams into a temporary directory inside the cache (same file
//! system) and is checked against its descriptor's sha256, then the image's own
//! `manifest.json` is checked (content hash, the sha256 of every artifact, bootability:
//! [`super::verify::verify_dir`]) and it must come from this voidbox's recipe
//! ([`super::build::recipe_matches`]). Only then is it renamed into `images/<hash>/`, an
//! ordinary cached image. Any failure leaves nothing in the cache.
//!
//! The index (`registry/index.json`) maps each reference pulled or pushed (tag references
//! in canonical form, and `registry/repository@sha256:…`) to the manifest digest and the
//! image hash, so that a digest-pinned reference already pulled needs no network, and a tag
//! whose digest did not change needs only a manifest `HEAD`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use voidbox_oci::artifact::{
    Access, ArtifactManifest, ArtifactRemote, Descriptor, TITLE_ANNOTATION,
};
use voidbox_oci::{Digest, ImageRef, OciError};

use super::build::recipe_matches;
use super::cache::{Cache, CachedImage};
use super::error::ImageError;
use super::manifest::{
    Manifest, AGENT_FILE, CONFIG_FILE, MANIFEST_FILE, SYSTEM_DISK_FILE, VMLINUX_FILE,
};
use super::recipe::{self, Profile};
use super::{verify, ProfileChoice};

/// The environment variable naming a guest image in a registry (`registry/repo:tag` or
/// `registry/repo@sha256:…`) that the engine boots instead of a locally built one.
pub const GUEST_IMAGE_ENV: &str = "VOIDBOX_GUEST_IMAGE";

/// `artifactType` of a voidbox guest image.
pub const ARTIFACT_TYPE: &str = "application/vnd.voidbox.guest-image.v1";
/// Media type of the config blob (a [`GuestImageConfig`]).
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.config.v1+json";
/// Media type of the `vmlinux` layer.
pub const VMLINUX_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.vmlinux.v1";
/// Media type of the `system.erofs` layer.
pub const SYSTEM_DISK_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.system-disk.v1.erofs";
/// Media type of the `voidbox-agent` layer.
pub const AGENT_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.agent.v1";
/// Media type of the `config` (kernel `.config`) layer.
pub const KERNEL_CONFIG_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.kernel-config.v1";
/// Media type of the `manifest.json` layer.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.voidbox.guest-image.manifest.v1+json";

/// Manifest annotation: the image's profile (`plain`/`compat`).
pub const PROFILE_ANNOTATION: &str = "org.voidbox.guest-image.profile";
/// Manifest annotation: the image's content hash (its cache directory name).
pub const HASH_ANNOTATION: &str = "org.voidbox.guest-image.hash";
/// Manifest annotation: the guest kernel release.
pub const KERNEL_RELEASE_ANNOTATION: &str = "org.voidbox.guest-image.kernel-release";

/// Largest artifact manifest accepted (a few hundred bytes in practice).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;
/// Largest config blob accepted.
pub const MAX_CONFIG_BYTES: u64 = 64 << 10;

/// One file of a guest image as a layer of the artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    /// The file name in the image directory (and the layer's title annotation).
    pub file: &'static str,
    /// The layer's media type.
    pub media_type: &'static str,
    /// The largest size accepted for it.
    pub max_size: u64,
}

/// The layers of a guest image artifact, in push order; a pull wants exactly these.
pub const LAYERS: [LayerKind; 5] = [
    LayerKind {
        file: MANIFEST_FILE,
        media_type: MANIFEST_MEDIA_TYPE,
        max_size: 1 << 20,
    },
    LayerKind {
        file: VMLINUX_FILE,
        media_type: VMLINUX_MEDIA_TYPE,
        max_size: 512 << 20,
    },
    LayerKind {
        file: SYSTEM_DISK_FILE,
        media_type: SYSTEM_DISK_MEDIA_TYPE,
        max_size: 4 << 30,
    },
    LayerKind {
        file: AGENT_FILE,
        media_type: AGENT_MEDIA_TYPE,
        max_size: 256 << 20,
    },
    LayerKind {
        file: CONFIG_FILE,
        media_type: KERNEL_CONFIG_MEDIA_TYPE,
        max_size: 16 << 20,
    },
];

/// The config blob of a guest image artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestImageConfig {
    /// Kernel profile.
    pub profile: Profile,
    /// Content hash of the image (its cache directory name).
    pub hash: String,
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// `manifest.json` format.
    pub format: u32,
    /// The image builder version that made it.
    pub builder_version: u32,
    /// The kernel command line the image expects.
    pub cmdline: String,
    /// When the image was built (Unix seconds).
    pub created_unix: u64,
}

impl GuestImageConfig {
    /// The config describing an image's manifest.
    pub fn of(m: &Manifest) -> GuestImageConfig {
        GuestImageConfig {
            profile: m.profile,
            hash: m.hash.clone(),
            kernel_release: m.kernel.release.clone(),
            format: m.format,
            builder_version: m.inputs.builder_version,
            cmdline: m.cmdline.clone(),
            created_unix: m.created_unix,
        }
    }
}

/// Checks that `m` is a guest image artifact with exactly the expected layers, each within
/// its size bound, and returns the layer descriptor for each of [`LAYERS`] (same order).
/// The error says what was found instead.
pub fn check_artifact(m: &ArtifactManifest) -> Result<Vec<Descriptor>, String> {
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) || m.config.media_type != CONFIG_MEDIA_TYPE
    {
        return Err(format!(
            "not a voidbox guest image: artifactType {}, config media type {} (expected \
             artifactType {ARTIFACT_TYPE} and config {CONFIG_MEDIA_TYPE})",
            m.artifact_type.as_deref().unwrap_or("(none)"),
            m.config.media_type
        ));
    }
    if m.config.size > MAX_CONFIG_BYTES {
        return Err(format!(
            "config blob of {} bytes (at most {MAX_CONFIG_BYTES} accepted)",
            m.config.size
        ));
    }
    let found = || {
        m.layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if m.layers.len() != LAYERS.len() {
        return Err(format!(
            "{} layers ({}), expected {}: {}",
            m.layers.len(),
            found(),
            LAYERS.len(),
            LAYERS.map(|k| k.media_type).join(", ")
        ));
    }
    let mut out = Vec::with_capacity(LAYERS.len());
    for kind in &LAYERS {
        let mut matching = m.layers.iter().filter(|l| l.media_type == kind.media_type);
        let (Some(layer), None) = (matching.next(), matching.next()) else {
            return Err(format!(
                "layers ({}) do not hold exactly one {} ({})",
                found(),
                kind.media_type,
                kind.file
            ));
        };
        if layer.title() != Some(kind.file) {
            return Err(format!(
                "layer {} is titled {:?}, expected {:?}",
                kind.media_type,
                layer.title().unwrap_or("(none)"),
                kind.file
            ));
        }
        if layer.size > kind.max_size {
            return Err(format!(
                "layer {} declares {} bytes (at most {} accepted)",
                kind.file, layer.size, kind.max_size
            ));
        }
        out.push(layer.clone());
    }
    Ok(out)
}

/// Builds the artifact manifest of an image from its config blob and its files' bytes
/// (in [`LAYERS`] order).
pub fn artifact_manifest(m: &Manifest, config: &[u8], files: &[Vec<u8>]) -> ArtifactManifest {
    let layers = LAYERS
        .iter()
        .zip(files)
        .map(|(k, bytes)| Descriptor::of(k.media_type, bytes).annotated(TITLE_ANNOTATION, k.file))
        .collect();
    let mut a = ArtifactManifest::new(
        ARTIFACT_TYPE,
        Descriptor::of(CONFIG_MEDIA_TYPE, config),
        layers,
    );
    a.annotations
        .insert(PROFILE_ANNOTATION.into(), m.profile.as_str().into());
    a.annotations.insert(HASH_ANNOTATION.into(), m.hash.clone());
    a.annotations
        .insert(KERNEL_RELEASE_ANNOTATION.into(), m.kernel.release.clone());
    a
}

// ---------------------------------------------------------------------------------------
// The index: registry/index.json

/// One reference's record in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The manifest digest the reference resolved to.
    pub digest: String,
    /// The image hash that digest holds.
    pub hash: String,
    /// When it was recorded (Unix seconds).
    pub updated_unix: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    version: u32,
    refs: BTreeMap<String, IndexEntry>,
}

const INDEX_VERSION: u32 = 1;

fn index_path(cache: &Cache) -> PathBuf {
    cache.root().join("registry").join("index.json")
}

/// The index; a missing or unreadable one is empty (it only saves network round trips).
fn load_index(cache: &Cache) -> Index {
    fs::read(index_path(cache))
        .ok()
        .and_then(|b| serde_json::from_slice::<Index>(&b).ok())
        .filter(|i| i.version == INDEX_VERSION)
        .unwrap_or_default()
}

/// The index entry for `key` (a canonical tag reference or a [`pin_of`]).
pub fn index_entry(cache: &Cache, key: &str) -> Option<IndexEntry> {
    load_index(cache).refs.get(key).cloned()
}

/// Records `keys` → (`digest`, `hash`), under the index lock, atomically (write + rename).
fn record(cache: &Cache, keys: &[String], digest: &Digest, hash: &str) -> Result<(), ImageError> {
    let _lock = cache.lock("registry-index", &mut || {})?;
    let mut index = load_index(cache);
    index.version = INDEX_VERSION;
    let now = now_unix();
    for k in keys {
        index.refs.insert(
            k.clone(),
            IndexEntry {
                digest: digest.to_string(),
                hash: hash.to_string(),
                updated_unix: now,
            },
        );
    }
    let path = index_path(cache);
    let dir = path.parent().unwrap_or(cache.root());
    fs::create_dir_all(dir).map_err(ImageError::io(dir))?;
    let tmp = dir.join(format!("index.json.{}", std::process::id()));
    let body = serde_json::to_vec_pretty(&index).unwrap_or_default();
    fs::write(&tmp, body).map_err(ImageError::io(&tmp))?;
    fs::rename(&tmp, &path).map_err(ImageError::io(&path))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// `registry/repository@sha256:…`: the digest-pinned form of `r` at `digest`.
pub fn pin_of(r: &ImageRef, digest: &Digest) -> String {
    format!("{}/{}@{}", r.registry(), r.repository(), digest)
}

/// The index key of a tag reference (its canonical form).
fn tag_key(r: &ImageRef) -> String {
    r.canonical()
}

/// The cached image `hash`, if its directory holds a readable manifest of that hash.
fn cached_image(cache: &Cache, hash: &str) -> Option<CachedImage> {
    if !super::cache::is_hash(hash) {
        return None;
    }
    let dir = cache.image_dir(hash);
    let m = Manifest::load(&dir).ok()?;
    (m.hash == hash).then_some(CachedImage { dir, manifest: m })
}

/// The image a digest was pulled (or pushed) as, if it is still cached.
fn cached_for_digest(cache: &Cache, digest: &Digest) -> Option<CachedImage> {
    load_index(cache)
        .refs
        .values()
        .filter(|e| e.digest == digest.as_str())
        .find_map(|e| cached_image(cache, &e.hash))
}

// ---------------------------------------------------------------------------------------
// Errors

/// An `OciError` met while talking to the registry about `reference`: content refusals
/// (digest mismatches, wrong media types) are verification failures (exit 1), everything
/// else — unreachable, refused credentials, unknown reference — an environment problem
/// (exit 3). Credentials never appear: the OCI crate scrubs them.
fn oci_error(reference: &str, e: OciError) -> ImageError {
    match e {
        OciError::DigestMismatch { .. } | OciError::UnsupportedMediaType { .. } => {
            refused(reference, e.to_string())
        }
        other => {
            let msg = other.to_string();
            ImageError::Environment(if msg.contains(reference) {
                msg
            } else {
                format!("{reference}: {msg}")
            })
        }
    }
}

fn refused(reference: &str, why: String) -> ImageError {
    ImageError::Verify {
        hash: reference.to_string(),
        problems: vec![why],
    }
}

fn parse_ref(reference: &str) -> Result<ImageRef, ImageError> {
    ImageRef::parse(reference).map_err(|e| ImageError::Environment(e.to_string()))
}

/// Runs `fut` from synchronous code (see [`crate::oci::block_on`]).
fn block_on<T: Send>(
    reference: &str,
    fut: impl std::future::Future<Output = Result<T, ImageError>> + Send,
) -> Result<T, ImageError> {
    crate::oci::block_on(fut).map_err(|e| oci_error(reference, e))?
}

// ---------------------------------------------------------------------------------------
// Push

/// What a push did.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The reference pushed to, as given.
    pub reference: String,
    /// The manifest digest.
    pub digest: Digest,
    /// The digest-pinned reference (`registry/repository@sha256:…`).
    pub pinned: String,
    /// The image pushed.
    pub image: CachedImage,
    /// How many blobs were uploaded (the others were already in the registry).
    pub uploaded: usize,
}

/// The image `voidbox image push` pushes: the one `hash_prefix` names, else the newest
/// usable one (current layout, this voidbox's recipe) of `profile` (`Auto` probes the host).
pub fn select_for_push(
    cache: &Cache,
    hash_prefix: Option<&str>,
    profile: ProfileChoice,
) -> Result<CachedImage, ImageError> {
    if let Some(prefix) = hash_prefix {
        let hash = cache.resolve(prefix)?;
        let dir = cache.image_dir(&hash);
        let manifest = Manifest::load(&dir)?;
        let wanted = match profile {
            ProfileChoice::Auto => None,
            p => Some(super::resolve_profile(p)?),
        };
        if let Some(p) = wanted.filter(|p| *p != manifest.profile) {
            return Err(ImageError::NotFound(format!(
                "image {} is a {} image, not {p}",
                &hash[..12],
                manifest.profile
            )));
        }
        return Ok(CachedImage { dir, manifest });
    }
    let profile = super::resolve_profile(profile)?;
    let (images, _) = cache.list()?;
    images
        .into_iter()
        .find(|i| {
            i.manifest.profile == profile
                && i.manifest.is_current_layout()
                && recipe_matches(&i.manifest.kernel_inputs)
        })
        .ok_or_else(|| {
            ImageError::NotFound(format!(
                "no usable cached {profile} image in {} (run `voidbox image build --profile \
                 {profile}`, or name one by hash)",
                cache.images_dir().display()
            ))
        })
}

/// Pushes `image` to `reference` (a tag) as a guest image artifact, after verifying it, and
/// records the reference in the index. `insecure` lists registries that may use plain HTTP
/// although not on loopback.
pub fn push(
    cache: &Cache,
    reference: &str,
    image: &CachedImage,
    insecure: &[String],
) -> Result<Pushed, ImageError> {
    let r = parse_ref(reference)?;
    if r.digest().is_some() {
        return Err(ImageError::Environment(format!(
            "{reference}: push to a tag, not a digest (the digest is the result of the push)"
        )));
    }
    let m = &image.manifest;
    if !m.is_current_layout() || !recipe_matches(&m.kernel_inputs) {
        return Err(ImageError::Environment(format!(
            "image {} is of an old layout or was built from another recipe than this \
             voidbox's: no voidbox of this version would boot it; build the current one with \
             `voidbox image build --profile {}`",
            &m.hash[..12.min(m.hash.len())],
            m.profile
        )));
    }
    // Never publish a damaged image.
    let tmp = cache.tmp_dir()?;
    let scratch = tempfile::Builder::new()
        .prefix("push-verify-")
        .tempdir_in(&tmp)
        .map_err(ImageError::io(&tmp))?;
    verify::verify_dir(&image.dir, scratch.path())?;
    drop(scratch);

    let files = LAYERS
        .iter()
        .map(|k| {
            let p = image.dir.join(k.file);
            fs::read(&p).map_err(ImageError::io(&p))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let config = serde_json::to_vec(&GuestImageConfig::of(m)).unwrap_or_default();
    let manifest = artifact_manifest(m, &config, &files);
    // What a pull will demand, checked before anything is uploaded.
    check_artifact(&manifest).map_err(|e| refused(reference, e))?;

    let (digest, uploaded) = block_on(reference, async {
        let remote = ArtifactRemote::connect(&r, Access::Push, insecure)
            .await
            .map_err(|e| oci_error(reference, e))?;
        let mut uploaded = 0;
        for (desc, bytes) in manifest.layers.iter().zip(files) {
            if remote
                .push_blob(desc, bytes)
                .await
                .map_err(|e| oci_error(reference, e))?
            {
                uploaded += 1;
            }
        }
        if remote
            .push_blob(&manifest.config, config.clone())
            .await
            .map_err(|e| oci_error(reference, e))?
        {
            uploaded += 1;
        }
        let digest = remote
            .push_manifest(&manifest)
            .await
            .map_err(|e| oci_error(reference, e))?;
        Ok((digest, uploaded))
    })?;
    let pinned = pin_of(&r, &digest);
    record(cache, &[tag_key(&r), pinned.clone()], &digest, &m.hash)?;
    Ok(Pushed {
        reference: reference.to_string(),
        digest,
        pinned,
        image: image.clone(),
        uploaded,
    })
}

// ---------------------------------------------------------------------------------------
// Pull

/// What a pull found or did.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference, as given.
    pub reference: String,
    /// The manifest digest it resolved to.
    pub digest: Digest,
    /// The digest-pinned reference (`registry/repository@sha256:…`).
    pub pinned: String,
    /// The cached image (`images/<hash>/`).
    pub image: CachedImage,
    /// Whether blobs were downloaded (false: the digest was already in the cache).
    pub downloaded: bool,
    /// Whether the registry was contacted (false: a pinned reference found in the index).
    pub contacted_registry: bool,
}

/// Pulls the guest image `reference` into `cache` (see the module docs), or finds it there:
/// a digest-pinned reference already pulled needs no network; a tag is resolved with a
/// manifest `HEAD` and downloaded only when its digest is not cached. `log` receives a
/// line per step worth telling a person (on stderr, say).
pub fn pull(
    cache: &Cache,
    reference: &str,
    insecure: &[String],
    log: &(dyn Fn(&str) + Sync),
) -> Result<Pulled, ImageError> {
    let r = parse_ref(reference)?;
    if let Some(d) = r.digest() {
        if let Some(img) =
            index_entry(cache, &pin_of(&r, &d)).and_then(|e| cached_image(cache, &e.hash))
        {
            usable(reference, &img)?;
            return Ok(Pulled {
                reference: reference.to_string(),
                pinned: pin_of(&r, &d),
                digest: d,
                image: img,
                downloaded: false,
                contacted_registry: false,
            });
        }
    }
    let last = r
        .digest()
        .is_none()
        .then(|| index_entry(cache, &tag_key(&r)))
        .flatten();
    let unreachable_hint = |e: ImageError| -> ImageError {
        match (&e, &last) {
            (ImageError::Environment(msg), Some(last)) => ImageError::Environment(format!(
                "{msg}\n  help: {reference} was last pulled as {}; to use that cached image \
                 without the registry, pin it: {}",
                last.digest,
                Digest::parse(&last.digest)
                    .map(|d| pin_of(&r, &d))
                    .unwrap_or_else(|_| last.digest.clone())
            )),
            _ => e,
        }
    };
    let result = block_on(reference, async {
        let remote = ArtifactRemote::connect(&r, Access::Pull, insecure)
            .await
            .map_err(|e| oci_error(reference, e))?;
        let digest = match r.digest() {
            Some(d) => d,
            None => remote
                .resolve_digest()
                .await
                .map_err(|e| oci_error(reference, e))?,
        };
        if let Some(img) = cached_for_digest(cache, &digest) {
            return Ok((digest, img, false));
        }
        log(&format!("pulling guest image {reference} ({digest})"));
        let img = download(cache, &remote, reference, &digest, log).await?;
        Ok((digest, img, true))
    });
    let (digest, image, downloaded) = result.map_err(unreachable_hint)?;
    usable(reference, &image)?;
    let pinned = pin_of(&r, &digest);
    let mut keys = vec![pinned.clone()];
    if r.digest().is_none() {
        keys.push(tag_key(&r));
    }
    record(cache, &keys, &digest, &image.manifest.hash)?;
    Ok(Pulled {
        reference: reference.to_string(),
        digest,
        pinned,
        image,
        downloaded,
        contacted_registry: true,
    })
}

/// Refuses an image this voidbox would never boot (old layout, another recipe).
fn usable(reference: &str, img: &CachedImage) -> Result<(), ImageError> {
    let m = &img.manifest;
    if !m.is_current_layout() {
        return Err(refused(
            reference,
            "an image of the old layout (kernel + initramfs): never booted".into(),
        ));
    }
    if !recipe_matches(&m.kernel_inputs) {
        return Err(refused(
            reference,
            format!(
                "image {} was built from another recipe than this voidbox's (builder version \
                 {}, this voidbox {}, or different kernel patches/config fragments): push one \
                 built by this voidbox (`voidbox image build`, then `voidbox image push`)",
                &m.hash[..12.min(m.hash.len())],
                m.kernel_inputs.builder_version,
                recipe::BUILDER_VERSION
            ),
        ));
    }
    Ok(())
}

/// Downloads, checks and installs the artifact `digest`; nothing stays in the cache on error
/// (the staging directory is a temporary directory under the cache's `tmp/`).
async fn download(
    cache: &Cache,
    remote: &ArtifactRemote,
    reference: &str,
    digest: &Digest,
    log: &(dyn Fn(&str) + Sync),
) -> Result<CachedImage, ImageError> {
    let err = |e: OciError| oci_error(reference, e);
    let body = remote
        .fetch_manifest(digest, MAX_MANIFEST_BYTES)
        .await
        .map_err(err)?;
    let artifact = ArtifactManifest::parse(&body)
        .map_err(|e| refused(reference, format!("not a voidbox guest image: {e}")))?;
    let layers = check_artifact(&artifact).map_err(|e| refused(reference, e))?;

    let config_bytes = remote
        .blob_to_vec(&artifact.config, "config blob")
        .await
        .map_err(err)?;
    let config: GuestImageConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| refused(reference, format!("config blob does not parse: {e}")))?;

    let tmp = cache.tmp_dir()?;
    let staging = tempfile::Builder::new()
        .prefix("pull-")
        .tempdir_in(&tmp)
        .map_err(ImageError::io(&tmp))?;
    let files = staging.path().join("files");
    fs::create_dir(&files).map_err(ImageError::io(&files))?;

    // manifest.json first (small): refuse an image from another recipe, or whose layers are
    // not the artifacts it records, before the large downloads.
    let mut manifest: Option<Manifest> = None;
    for (kind, desc) in LAYERS.iter().zip(&layers) {
        if let Some(m) = &manifest {
            check_recorded(reference, m, kind, desc)?;
            log(&format!(
                "  {} ({})",
                kind.file,
                crate::units::human_size(desc.size)
            ));
        }
        let dest = files.join(kind.file);
        remote
            .blob_to_file(desc, &dest, &format!("layer {}", kind.file))
            .await
            .map_err(err)?;
        if kind.file == MANIFEST_FILE {
            manifest = Some(check_pulled_manifest(reference, &dest, &config, &artifact)?);
        }
    }
    let Some(manifest) = manifest else {
        return Err(refused(reference, "no manifest.json layer".into()));
    };
    set_mode(&files.join(AGENT_FILE), 0o755)?;

    // The directory must carry the image's name for verify_dir.
    let named = staging.path().join(&manifest.hash);
    fs::rename(&files, &named).map_err(ImageError::io(&named))?;
    let scratch = staging.path().join("scratch");
    fs::create_dir(&scratch).map_err(ImageError::io(&scratch))?;
    let report = verify::verify_dir(&named, &scratch).map_err(|e| match e {
        ImageError::Verify { problems, .. } => ImageError::Verify {
            hash: format!("{reference} ({})", manifest.hash),
            problems,
        },
        other => other,
    })?;

    let dest = cache.image_dir(&manifest.hash);
    {
        let _lock = cache.lock(&manifest.hash, &mut || {
            log("  another process is installing this image; waiting for it")
        })?;
        cache.install(&named, &dest)?;
    }
    drop(staging);
    let installed = Manifest::load(&dest)?;
    if installed.hash != report.manifest.hash {
        return Err(ImageError::Manifest {
            path: dest.join(MANIFEST_FILE),
            what: "hash differs from the directory name".into(),
        });
    }
    Ok(CachedImage {
        dir: dest,
        manifest: installed,
    })
}

/// Layer `kind` is the artifact `m` records for it (digest and size).
fn check_recorded(
    reference: &str,
    m: &Manifest,
    kind: &LayerKind,
    desc: &Descriptor,
) -> Result<(), ImageError> {
    let recorded = m.artifacts().into_iter().find(|a| a.file == kind.file);
    match recorded {
        Some(a) if format!("sha256:{}", a.sha256) == desc.digest && a.size == desc.size => Ok(()),
        Some(a) => Err(refused(
            reference,
            format!(
                "layer {} is {} ({} bytes) but the image's manifest.json records \
                 sha256:{} ({} bytes)",
                kind.file, desc.digest, desc.size, a.sha256, a.size
            ),
        )),
        None => Err(refused(
            reference,
            format!("the image's manifest.json records no {}", kind.file),
        )),
    }
}

/// The pulled `manifest.json` at `dest`, checked against the artifact's config blob and
/// annotations, today's layout and this voidbox's recipe.
fn check_pulled_manifest(
    reference: &str,
    dest: &Path,
    config: &GuestImageConfig,
    artifact: &ArtifactManifest,
) -> Result<Manifest, ImageError> {
    let text = fs::read_to_string(dest).map_err(ImageError::io(dest))?;
    let m = Manifest::parse(&text)
        .map_err(|e| refused(reference, format!("the image's manifest.json: {e}")))?;
    if m.hash != config.hash || m.profile != config.profile {
        return Err(refused(
            reference,
            format!(
                "config blob says image {} ({}), its manifest.json says {} ({})",
                config.hash, config.profile, m.hash, m.profile
            ),
        ));
    }
    if let Some(h) = artifact.annotations.get(HASH_ANNOTATION) {
        if h != &m.hash {
            return Err(refused(
                reference,
                format!(
                    "annotation {HASH_ANNOTATION} is {h}, manifest.json says {}",
                    m.hash
                ),
            ));
        }
    }
    let files: Vec<&str> = m.artifacts().iter().map(|a| a.file.as_str()).collect();
    let expected: Vec<&str> = LAYERS
        .iter()
        .map(|k| k.file)
        .filter(|f| *f != MANIFEST_FILE)
        .collect();
    if !m.is_current_layout() || files != expected {
        return Err(refused(
            reference,
            format!(
                "the image's manifest.json records {} (expected {})",
                files.join(", "),
                expected.join(", ")
            ),
        ));
    }
    let probe = CachedImage {
        dir: PathBuf::new(),
        manifest: m.clone(),
    };
    usable(reference, &probe)?;
    Ok(m)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(ImageError::io(path))
}

// ---------------------------------------------------------------------------------------
// VOIDBOX_GUEST_IMAGE

/// The guest image [`GUEST_IMAGE_ENV`] names, pulled first if need be (blocking): `Ok(None)`
/// when the variable is unset. A tag is resolved against the registry each time (one
/// manifest `HEAD`) and pulled when its digest changed; a digest-pinned reference already
/// pulled needs no network. A registry that cannot be reached is an error naming the
/// reference (and, when a pull of it is cached, the digest to pin) — never a silent fallback
/// to another image. An empty value, or an image whose profile is not `profile` (the
/// host's), is an error too.
pub fn image_from_env(cache: &Cache, profile: Profile) -> Result<Option<CachedImage>, ImageError> {
    match std::env::var_os(GUEST_IMAGE_ENV) {
        None => Ok(None),
        Some(v) => {
            let Some(v) = v.to_str() else {
                return Err(ImageError::Environment(format!(
                    "{GUEST_IMAGE_ENV} is not valid UTF-8"
                )));
            };
            image_for_ref(cache, profile, v).map(Some)
        }
    }
}

/// [`image_from_env`] for the value `reference` of [`GUEST_IMAGE_ENV`].
pub fn image_for_ref(
    cache: &Cache,
    profile: Profile,
    reference: &str,
) -> Result<CachedImage, ImageError> {
    let reference = reference.trim();
    if reference.is_empty() {
        return Err(ImageError::Environment(format!(
            "{GUEST_IMAGE_ENV} is set but empty: set it to a guest image reference \
             (registry/repository:tag or …@sha256:…) or unset it"
        )));
    }
    let insecure = insecure_list(&[]);
    let pulled =
        pull(cache, reference, &insecure, &|line| eprintln!("{line}")).map_err(|e| match e {
            ImageError::Environment(msg) => {
                let msg = msg
                    .strip_prefix(reference)
                    .and_then(|m| m.strip_prefix(": "))
                    .unwrap_or(&msg);
                ImageError::Environment(format!("{GUEST_IMAGE_ENV}={reference}: {msg}"))
            }
            other => other,
        })?;
    let m = &pulled.image.manifest;
    if m.profile != profile {
        return Err(ImageError::Environment(format!(
            "{GUEST_IMAGE_ENV}={reference} is a {} guest image (hash {}), but this host needs \
             a {profile} one: push an image built with `voidbox image build --profile {profile}` \
             and point {GUEST_IMAGE_ENV} at it, or unset {GUEST_IMAGE_ENV}",
            m.profile,
            &m.hash[..12.min(m.hash.len())]
        )));
    }
    Ok(pulled.image)
}

// ---------------------------------------------------------------------------------------
// The CLI arms (`voidbox image push|pull`)

/// `voidbox image push REF [HASH] [--profile P]`: prints the digest (JSON: reference, digest,
/// pinned reference, hash, profile, kernel release).
pub fn cli_push(
    reference: &str,
    hash: Option<&str>,
    profile: ProfileChoice,
    insecure_flags: &[String],
    format: super::Format,
    cache_dir: Option<&Path>,
) -> Result<std::process::ExitCode, ImageError> {
    let cache = Cache::open(cache_dir)?;
    let image = select_for_push(&cache, hash, profile)?;
    let insecure = insecure_list(insecure_flags);
    let m = &image.manifest;
    eprintln!(
        "pushing image {} ({} profile, kernel {}) to {reference}",
        &m.hash[..12.min(m.hash.len())],
        m.profile,
        m.kernel.release
    );
    let p = push(&cache, reference, &image, &insecure)?;
    eprintln!(
        "pushed {} ({} blob(s) uploaded); pin it as {}",
        p.digest, p.uploaded, p.pinned
    );
    match format {
        super::Format::Json => println!(
            "{}",
            transfer_json(
                &p.reference,
                &p.digest,
                &p.pinned,
                m,
                None,
                serde_json::json!({ "uploaded_blobs": p.uploaded }),
            )
        ),
        super::Format::Human => println!("{}", p.digest),
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `voidbox image pull REF`: prints the image hash and directory (JSON: reference, digest,
/// pinned reference, hash, dir, profile, kernel release, downloaded).
pub fn cli_pull(
    reference: &str,
    insecure_flags: &[String],
    format: super::Format,
    cache_dir: Option<&Path>,
) -> Result<std::process::ExitCode, ImageError> {
    let cache = Cache::open(cache_dir)?;
    let insecure = insecure_list(insecure_flags);
    let p = pull(&cache, reference, &insecure, &|line| eprintln!("{line}"))?;
    let m = &p.image.manifest;
    eprintln!(
        "{} image {} ({} profile, kernel {}) from {} ({})",
        if p.downloaded { "pulled" } else { "cached" },
        &m.hash[..12.min(m.hash.len())],
        m.profile,
        m.kernel.release,
        reference,
        p.digest
    );
    match format {
        super::Format::Json => println!(
            "{}",
            transfer_json(
                &p.reference,
                &p.digest,
                &p.pinned,
                m,
                Some(&p.image.dir),
                serde_json::json!({
                    "downloaded": p.downloaded,
                    "contacted_registry": p.contacted_registry,
                }),
            )
        ),
        super::Format::Human => {
            println!("{}", m.hash);
            println!("{}", p.image.dir.display());
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `--insecure-registry` flags and [`crate::oci::INSECURE_REGISTRIES_ENV`], merged.
/// The JSON document `image push|pull --format json` print: reference, digest, pinned
/// reference, image hash, `dir` (when given), profile and kernel release, then the fields of
/// the object `extra`.
fn transfer_json(
    reference: &str,
    digest: &Digest,
    pinned: &str,
    m: &Manifest,
    dir: Option<&Path>,
    extra: serde_json::Value,
) -> String {
    let mut doc = serde_json::Map::new();
    doc.insert("reference".into(), reference.into());
    doc.insert("digest".into(), digest.as_str().into());
    doc.insert("pinned".into(), pinned.into());
    doc.insert("hash".into(), m.hash.as_str().into());
    if let Some(dir) = dir {
        doc.insert("dir".into(), serde_json::json!(dir));
    }
    doc.insert("profile".into(), serde_json::json!(m.profile));
    doc.insert("kernel_release".into(), m.kernel.release.as_str().into());
    if let serde_json::Value::Object(extra) = extra {
        doc.extend(extra);
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

fn insecure_list(flags: &[String]) -> Vec<String> {
    crate::oci::pull_options_with(flags, voidbox_oci::Platform::default()).insecure_registries
}

#[cfg(test)]
mod tests {
    use super::super::manifest::tests::manifest;
    use super::*;

    fn files() -> Vec<Vec<u8>> {
        LAYERS.iter().map(|k| k.file.as_bytes().to_vec()).collect()
    }

    fn sample() -> ArtifactManifest {
        let m = manifest();
        let config = serde_json::to_vec(&GuestImageConfig::of(&m)).unwrap();
        artifact_manifest(&m, &config, &files())
    }

    #[test]
    fn built_manifests_pass_and_round_trip() {
        let a = sample();
        let back = ArtifactManifest::parse(&a.to_body()).unwrap();
        assert_eq!(back, a);
        let layers = check_artifact(&back).unwrap();
        assert_eq!(layers.len(), 5);
        for (k, l) in LAYERS.iter().zip(&layers) {
            assert_eq!(l.media_type, k.media_type);
            assert_eq!(l.title(), Some(k.file));
        }
        assert_eq!(a.annotations[PROFILE_ANNOTATION], "compat");
        assert_eq!(a.annotations[HASH_ANNOTATION], manifest().hash);
        let text = String::from_utf8(a.to_body()).unwrap();
        assert!(text.contains(ARTIFACT_TYPE) && text.contains(CONFIG_MEDIA_TYPE));
        // Layer order in the registry does not matter.
        let mut shuffled = a.clone();
        shuffled.layers.reverse();
        assert!(check_artifact(&shuffled).is_ok());
    }

    #[test]
    fn container_images_and_other_artifacts_are_refused() {
        let mut a = sample();
        a.artifact_type = None;
        a.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        let e = check_artifact(&a).unwrap_err();
        assert!(e.contains("not a voidbox guest image"), "{e}");
        assert!(
            e.contains("(none)") && e.contains("image.config.v1+json"),
            "{e}"
        );
        let mut b = sample();
        b.artifact_type = Some("application/vnd.cncf.helm.chart".into());
        assert!(check_artifact(&b).unwrap_err().contains("helm"));
        let mut c = sample();
        c.config.media_type = "application/json".into();
        assert!(check_artifact(&c).is_err());
    }

    #[test]
    fn layer_sets_are_exact() {
        let mut missing = sample();
        missing.layers.pop();
        let e = check_artifact(&missing).unwrap_err();
        assert!(e.contains("4 layers"), "{e}");
        let mut dup = sample();
        dup.layers[4] = dup.layers[3].clone();
        let e = check_artifact(&dup).unwrap_err();
        assert!(e.contains("exactly one"), "{e}");
        let mut extra = sample();
        extra.layers.push(extra.layers[0].clone());
        assert!(check_artifact(&extra).is_err());
        let mut foreign = sample();
        foreign.layers[2].media_type = "application/vnd.oci.image.layer.v1.tar+gzip".into();
        let e = check_artifact(&foreign).unwrap_err();
        assert!(e.contains("tar+gzip"), "{e}");
    }

    #[test]
    fn titles_and_sizes_are_bounded() {
        let mut retitled = sample();
        retitled.layers[1] = retitled.layers[1]
            .clone()
            .annotated(TITLE_ANNOTATION, "../../etc/passwd");
        let e = check_artifact(&retitled).unwrap_err();
        assert!(e.contains("titled"), "{e}");
        let mut huge = sample();
        huge.layers[2].size = 5 << 30;
        let e = check_artifact(&huge).unwrap_err();
        assert!(e.contains("system.erofs") && e.contains("at most"), "{e}");
        let mut big_config = sample();
        big_config.config.size = MAX_CONFIG_BYTES + 1;
        assert!(check_artifact(&big_config)
            .unwrap_err()
            .contains("config blob"));
    }

    #[test]
    fn index_records_and_pins() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let r = ImageRef::parse("127.0.0.1:5000/team/guest:v1").unwrap();
        let d = Digest::of(b"manifest");
        let pin = pin_of(&r, &d);
        assert_eq!(pin, format!("127.0.0.1:5000/team/guest@{d}"));
        assert!(ImageRef::parse(&pin).unwrap().digest() == Some(d.clone()));
        assert!(index_entry(&cache, &pin).is_none());
        record(&cache, &[tag_key(&r), pin.clone()], &d, &"a".repeat(64)).unwrap();
        let e = index_entry(&cache, &pin).unwrap();
        assert_eq!(e.digest, d.to_string());
        assert_eq!(
            index_entry(&cache, &tag_key(&r)).unwrap().hash,
            "a".repeat(64)
        );
        // The image is not cached: the digest finds nothing.
        assert!(cached_for_digest(&cache, &d).is_none());
        // A corrupt index is an empty one, and the next record replaces it.
        fs::write(index_path(&cache), "{").unwrap();
        assert!(index_entry(&cache, &pin).is_none());
        record(&cache, std::slice::from_ref(&pin), &d, &"b".repeat(64)).unwrap();
        assert_eq!(index_entry(&cache, &pin).unwrap().hash, "b".repeat(64));
    }

    #[test]
    fn empty_or_unreachable_references_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let e = image_for_ref(&cache, Profile::Plain, "  ").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        assert_eq!(e.exit_code(), 3);
        // Nothing listens on port 1: the error names the reference; nothing is cached.
        let e = image_for_ref(&cache, Profile::Plain, "127.0.0.1:1/x/guest:v1").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("127.0.0.1:1/x/guest:v1"), "{msg}");
        assert!(msg.contains(GUEST_IMAGE_ENV), "{msg}");
        assert_eq!(e.exit_code(), 3);
        assert!(cache.list().unwrap().0.is_empty());
    }
}
