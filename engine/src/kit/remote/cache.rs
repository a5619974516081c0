//! The content-addressed store of skill trees and its ref index.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::*;

/// The tree digest (SHA-256, hex) of a skill tree: over the files sorted by relative path,
/// each as `path\0mode\0len\0bytes` (`mode` `755` for executables, else `644`; `len` in
/// decimal). Directories count only through the files they hold.
pub(crate) fn tree_digest(files: &[TreeFile]) -> String {
    let mut sorted: Vec<&TreeFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = Sha256::new();
    for f in sorted {
        h.update(f.path.as_bytes());
        h.update(b"\0");
        h.update(if f.executable { b"755" } else { b"644" });
        h.update(b"\0");
        h.update(f.data.len().to_string().as_bytes());
        h.update(b"\0");
        h.update(&f.data);
    }
    hex::encode(h.finalize())
}

pub(super) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Reads the skill tree at `dir` (regular files and directories only, within the kit's
/// limits).
pub(crate) fn read_tree(dir: &Path) -> Result<Vec<TreeFile>, String> {
    let mut files = Vec::new();
    let mut bytes = 0u64;
    for e in walkdir::WalkDir::new(dir).follow_links(false).min_depth(1) {
        let e = e.map_err(|e| e.to_string())?;
        let ft = e.file_type();
        if ft.is_dir() {
            continue;
        }
        let rel = e
            .path()
            .strip_prefix(dir)
            .map_err(|e| e.to_string())?
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", e.path().display()))?
            .to_string();
        if !ft.is_file() {
            return Err(format!("{rel} is not a regular file"));
        }
        let meta = e.metadata().map_err(|e| e.to_string())?;
        bytes += meta.len();
        if files.len() >= MAX_FILES || bytes > MAX_BYTES {
            return Err("larger than a skill may be".into());
        }
        let data = fs::read(e.path()).map_err(|e| format!("{rel}: {e}"))?;
        files.push(TreeFile {
            path: rel,
            executable: meta.permissions().mode() & 0o111 != 0,
            data,
        });
    }
    Ok(files)
}

/// Whether `dir` holds SKILL.md and a tree whose digest is `hex`.
pub(super) fn tree_intact(dir: &Path, hex: &str) -> bool {
    dir.join("SKILL.md").is_file() && read_tree(dir).is_ok_and(|f| tree_digest(&f) == hex)
}

/// Stores `files` at `<sha_dir>/<digest>` (written in a temporary sibling, renamed into
/// place; an intact existing tree is kept), returning the digest and the directory.
pub(crate) fn install(sha_dir: &Path, files: &[TreeFile]) -> Result<(String, PathBuf), String> {
    let hex = tree_digest(files);
    let target = sha_dir.join(&hex);
    if tree_intact(&target, &hex) {
        return Ok((hex, target));
    }
    fs::create_dir_all(sha_dir).map_err(|e| format!("creating {}: {e}", sha_dir.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(sha_dir)
        .map_err(|e| format!("a temporary directory in {}: {e}", sha_dir.display()))?;
    for f in files {
        let path = tmp.path().join(&f.path);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            let mode = if f.executable { 0o755 } else { 0o644 };
            let mut out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&path)?;
            out.write_all(&f.data)?;
            out.set_permissions(fs::Permissions::from_mode(mode))?;
            out.sync_all()
        };
        write().map_err(|e| format!("writing {}: {e}", f.path))?;
    }
    if target.exists() {
        // Not intact (checked above): a damaged entry is replaced.
        fs::remove_dir_all(&target)
            .map_err(|e| format!("removing the damaged {}: {e}", target.display()))?;
    }
    let tmp_path = tmp.keep();
    if let Err(e) = fs::rename(&tmp_path, &target) {
        let _ = fs::remove_dir_all(&tmp_path);
        // Another fetch may have stored the same tree meanwhile.
        if !tree_intact(&target, &hex) {
            return Err(format!("storing {}: {e}", target.display()));
        }
    }
    Ok((hex, target))
}

pub(super) fn read_index(path: &Path) -> Option<IndexEntry> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(MAX_INDEX_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text).ok()
}

pub(super) fn write_index(path: &Path, entry: &IndexEntry) -> Result<(), String> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let ctx = |e: &dyn std::fmt::Display| format!("writing {}: {e}", path.display());
    fs::create_dir_all(parent).map_err(|e| ctx(&e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(|e| ctx(&e))?;
    let json = serde_json::to_vec_pretty(entry).map_err(|e| ctx(&e))?;
    tmp.write_all(&json).map_err(|e| ctx(&e))?;
    tmp.persist(path).map_err(|e| ctx(&e.error))?;
    Ok(())
}

/// `t` as an RFC 3339 UTC timestamp (`2024-01-31T12:00:00Z`).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
