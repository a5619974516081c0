//! npm tarballs: fetched over HTTPS (rustls) into a file while their SHA-512 is computed,
//! checked against the pinned integrity (the registry's own claim is never consulted), then
//! read as a gzipped tar from which only the wanted entries are taken.
//!
//! Bounded: a tarball is at most [`MAX_TARBALL_BYTES`], a shipped entry at most
//! [`MAX_ENTRY_BYTES`], a tarball at most [`MAX_ENTRIES`] entries; an entry with an absolute
//! path or a `..` component refuses the whole tarball.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Component, Path};
use std::time::Duration;

use base64::Engine as _;
use sha2::{Digest, Sha256, Sha512};

use super::error::RuntimesError;
use super::manifest::FileRecord;
use super::pins::Package;
use crate::error_chain::error_chain;

/// Environment variable naming the npm registry (a mirror serving the same layout).
pub const REGISTRY_ENV: &str = "VOIDBOX_NPM_REGISTRY";
/// The public npm registry.
pub const DEFAULT_REGISTRY: &str = "https://registry.npmjs.org";
/// Largest tarball accepted.
pub const MAX_TARBALL_BYTES: u64 = 1 << 30;
/// Largest shipped entry accepted.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Most entries a tarball may hold.
pub const MAX_ENTRIES: usize = 100_000;

/// The registry base URL: `$VOIDBOX_NPM_REGISTRY` (without a trailing `/`), else
/// [`DEFAULT_REGISTRY`].
pub fn registry() -> String {
    match std::env::var(REGISTRY_ENV) {
        Ok(v) if !v.trim().is_empty() => v.trim().trim_end_matches('/').to_string(),
        _ => DEFAULT_REGISTRY.to_string(),
    }
}

/// The tarball URL of `name@version` under `registry` (npm's layout:
/// `REGISTRY/@scope/name/-/name-VERSION.tgz`).
pub fn tarball_url(registry: &str, name: &str, version: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    format!("{registry}/{name}/-/{base}-{version}.tgz")
}

/// The SHA-512 digest an integrity string (`sha512-<base64>`) names.
pub fn parse_integrity(integrity: &str) -> Result<[u8; 64], String> {
    let b64 = integrity
        .strip_prefix("sha512-")
        .ok_or_else(|| format!("{integrity:?} is not a sha512 integrity"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("{integrity:?}: {e}"))?;
    raw.try_into()
        .map_err(|_| format!("{integrity:?}: not 64 bytes"))
}

/// The integrity string (`sha512-<base64>`) of a SHA-512 digest.
pub fn integrity_of(digest: &[u8]) -> String {
    format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// An HTTP client for the registry.
pub fn client() -> Result<reqwest::Client, RuntimesError> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .user_agent(concat!("voidbox/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| RuntimesError::Environment(format!("HTTP client: {}", error_chain(&e))))
}

/// Downloads `url` into `dest` (created), returning the SHA-512 of the bytes.
pub fn download(
    client: &reqwest::Client,
    url: &str,
    dest: &Path,
) -> Result<[u8; 64], RuntimesError> {
    let reg = |reason: String| RuntimesError::Registry {
        url: url.to_string(),
        reason,
    };
    let fut = async {
        let mut resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| reg(error_chain(&e.without_url())))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(reg(format!("HTTP {status}")));
        }
        if let Some(n) = resp.content_length().filter(|n| *n > MAX_TARBALL_BYTES) {
            return Err(reg(format!(
                "{n} bytes is more than the {MAX_TARBALL_BYTES} accepted"
            )));
        }
        let file = File::create(dest).map_err(RuntimesError::io(dest))?;
        let mut out = BufWriter::new(file);
        let mut hash = Sha512::new();
        let mut total = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            reg(format!(
                "after {total} bytes: {}",
                error_chain(&e.without_url())
            ))
        })? {
            total += chunk.len() as u64;
            if total > MAX_TARBALL_BYTES {
                return Err(reg(format!(
                    "more than the {MAX_TARBALL_BYTES} bytes accepted"
                )));
            }
            hash.update(&chunk);
            out.write_all(&chunk).map_err(RuntimesError::io(dest))?;
        }
        out.flush().map_err(RuntimesError::io(dest))?;
        Ok(hash.finalize().into())
    };
    crate::oci::block_on(fut).map_err(|e| reg(e.to_string()))?
}

/// Checks `digest` (of the bytes fetched from `url`) against `pkg`'s pinned integrity.
pub(crate) fn check_integrity(
    pkg: &Package,
    url: &str,
    digest: &[u8; 64],
) -> Result<(), RuntimesError> {
    let pinned = parse_integrity(&pkg.integrity).map_err(|what| RuntimesError::Tarball {
        package: pkg.id(),
        what: format!("bad pin: {what}"),
    })?;
    if &pinned != digest {
        return Err(RuntimesError::Integrity {
            package: pkg.id(),
            url: url.to_string(),
            expected: pkg.integrity.clone(),
            actual: integrity_of(digest),
        });
    }
    Ok(())
}

/// Why `path` (an entry's path) is refused, if it is.
fn unsafe_path(path: &Path) -> Option<&'static str> {
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Some("an absolute path"),
            Component::ParentDir => return Some("a `..` component"),
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    None
}

/// `path` without `.` components, `/`-separated.
fn normal(path: &Path) -> String {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Writes `pkg`'s shipped entries of the gzipped tarball `tgz` under `root` (at their disk
/// paths; parent directories must exist) and records them. Every entry's path is checked,
/// shipped or not; a shipped entry must be a regular file, present once.
pub(crate) fn extract(
    pkg: &Package,
    tgz: &Path,
    root: &Path,
) -> Result<Vec<FileRecord>, RuntimesError> {
    let refuse = |what: String| RuntimesError::Tarball {
        package: pkg.id(),
        what,
    };
    let file = File::open(tgz).map_err(RuntimesError::io(tgz))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    let mut found: Vec<Option<FileRecord>> = vec![None; pkg.files.len()];
    let entries = archive
        .entries()
        .map_err(|e| refuse(format!("not a gzipped tar: {e}")))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(refuse(format!("more than {MAX_ENTRIES} entries")));
        }
        let entry = entry.map_err(|e| refuse(format!("reading entry {n}: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| refuse(format!("entry {n}: {e}")))?
            .into_owned();
        if let Some(why) = unsafe_path(&path) {
            return Err(refuse(format!("entry {:?} has {why}", path.display())));
        }
        let name = normal(&path);
        let Some(i) = pkg.files.iter().position(|s| s.source == name) else {
            continue;
        };
        let ship = &pkg.files[i];
        if found[i].is_some() {
            return Err(refuse(format!("{name} appears twice")));
        }
        if !entry.header().entry_type().is_file() {
            return Err(refuse(format!("{name} is not a regular file")));
        }
        let size = entry.size();
        if size > MAX_ENTRY_BYTES {
            return Err(refuse(format!(
                "{name} is {size} bytes, more than the {MAX_ENTRY_BYTES} accepted"
            )));
        }
        let dest = root.join(&ship.dest);
        let (written, sha256) = copy_hashed(entry.take(MAX_ENTRY_BYTES), &dest)
            .map_err(|e| refuse(format!("{name}: {e}")))?;
        if written != size {
            return Err(refuse(format!(
                "{name}: {written} bytes read, {size} expected"
            )));
        }
        found[i] = Some(FileRecord {
            path: ship.dest.clone(),
            source: ship.source.clone(),
            size,
            sha256,
        });
    }
    pkg.files
        .iter()
        .zip(found)
        .map(|(s, f)| f.ok_or_else(|| refuse(format!("{} is missing", s.source))))
        .collect()
}

/// Copies `from` into the new file `dest`, returning the byte count and SHA-256 (hex).
pub(crate) fn copy_hashed(mut from: impl Read, dest: &Path) -> std::io::Result<(u64, String)> {
    let mut out = BufWriter::new(File::create(dest)?);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hash.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
    out.flush()?;
    Ok((total, hex::encode(hash.finalize())))
}
