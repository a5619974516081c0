//! The runtimes disk's manifest (`manifest.json`, on the disk and beside it in the cache)
//! and its cache key.
//!
//! The copy on the disk records what the disk holds: every package with its version,
//! canonical tarball URL, pinned integrity and the SHA-256 of every file shipped, and the
//! Debian files (musl's loader, bash) with their packages' versions — no host paths, no times, so the same pins give
//! the same disk. The cache's copy adds [`DiskRecord`] (the erofs file's SHA-256, size
//! and build time), which cannot be on the disk itself.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::RuntimesError;
use super::pins::{DebianFile, Package};
use super::LAYOUT_VERSION;

/// File name of the manifest, on the disk and in the cache directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the disk in the cache directory.
pub const DISK_FILE: &str = "runtimes.erofs";

/// What a runtimes disk holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version of the disk ([`LAYOUT_VERSION`]).
    pub layout: u32,
    /// Cache key: SHA-256 over the layout version, the pinned packages and the Debian
    /// packages' versions.
    pub key: String,
    /// Where the guest mounts it.
    pub mount: String,
    /// The npm packages shipped.
    pub packages: Vec<PackageRecord>,
    /// The files shipped from Debian packages (musl's loader, bash; absent in a layout 1
    /// disk's manifest, which `voidbox runtimes ls` still lists).
    #[serde(default)]
    pub debian: Vec<DebianRecord>,
    /// The erofs file (only in the cache's copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskRecord>,
}

/// One npm package on the disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageRecord {
    /// npm name.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// The tarball's URL on the public registry (a mirror set with `VOIDBOX_NPM_REGISTRY`
    /// serves the same bytes: they are checked against `integrity`).
    pub tarball: String,
    /// The pinned `sha512-…` integrity the tarball was checked against.
    pub integrity: String,
    /// The files shipped from it.
    pub files: Vec<FileRecord>,
}

/// One file on the disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Path on the disk, relative to its root (`claude/bin/claude`).
    pub path: String,
    /// Where it came from: the path inside the tarball, or inside the Debian package.
    pub source: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// A file on the disk from a Debian package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebianRecord {
    /// Debian package (`musl`, `bash-static`).
    pub package: String,
    /// Its Debian version.
    pub version: String,
    /// The file.
    pub file: FileRecord,
}

/// The erofs file in the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskRecord {
    /// File name in the cache directory ([`DISK_FILE`]).
    pub file: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the whole file, hex.
    pub sha256: String,
    /// When it was built (seconds since the epoch).
    pub created_unix: u64,
    /// How long the fetch and build took.
    pub build_seconds: f64,
}

impl Manifest {
    /// The manifest as it goes onto the disk (without [`Manifest::disk`]).
    pub fn on_disk(&self) -> Manifest {
        Manifest {
            disk: None,
            ..self.clone()
        }
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Reads `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Manifest, RuntimesError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(RuntimesError::io(&path))?;
        serde_json::from_str(&text).map_err(|e| RuntimesError::Manifest {
            path,
            what: e.to_string(),
        })
    }

    /// The package named `name`, if shipped.
    pub fn package(&self, name: &str) -> Option<&PackageRecord> {
        self.packages.iter().find(|p| p.name == name)
    }

    /// Every file on the disk except the manifest (packages' files, then Debian's).
    pub fn files(&self) -> impl Iterator<Item = &FileRecord> {
        self.packages
            .iter()
            .flat_map(|p| p.files.iter())
            .chain(self.debian.iter().map(|d| &d.file))
    }
}

/// What the cache key covers: the layout version, each package's identity and what is
/// taken from it, and each Debian file's package, version and disk path (not where the
/// host keeps it).
#[derive(Serialize)]
struct KeyInputs<'a> {
    layout: u32,
    packages: Vec<KeyPackage<'a>>,
    debian: Vec<(&'a str, &'a str, &'a str)>,
}

#[derive(Serialize)]
struct KeyPackage<'a> {
    name: &'a str,
    version: &'a str,
    integrity: &'a str,
    files: Vec<(&'a str, &'a str)>,
}

/// The cache key (64 hex digits) of a disk built from `packages` and `debian`.
pub(crate) fn cache_key(packages: &[Package], debian: &[DebianFile]) -> String {
    let inputs = KeyInputs {
        layout: LAYOUT_VERSION,
        packages: packages
            .iter()
            .map(|p| KeyPackage {
                name: &p.name,
                version: &p.version,
                integrity: &p.integrity,
                files: p
                    .files
                    .iter()
                    .map(|f| (f.source.as_str(), f.dest.as_str()))
                    .collect(),
            })
            .collect(),
        debian: debian
            .iter()
            .map(|d| (d.package, d.version.as_str(), d.dest))
            .collect(),
    };
    let json = serde_json::to_vec(&inputs).unwrap_or_default();
    hex::encode(Sha256::digest(&json))
}
