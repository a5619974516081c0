//! A GitHub tarball's skill subtree, taken out with every entry checked.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufReader, Read};
use std::path::{Component, Path};

use super::*;

/// A file of a skill tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TreeFile {
    /// Path relative to the skill root, `/`-separated.
    pub path: String,
    /// Any execute bit was set.
    pub executable: bool,
    /// Contents.
    pub data: Vec<u8>,
}

/// What a tarball's skill subtree holds.
#[derive(Debug)]
pub(crate) struct Extracted {
    /// The commit named by the pax global header's `comment`.
    pub commit: Option<String>,
    /// The skill's files.
    pub files: Vec<TreeFile>,
}

/// A directory of the tarball that may be the skill.
struct Candidate {
    /// Repo-relative prefix (`skills/x/`, `x/` or empty).
    prefix: String,
    files: BTreeMap<String, TreeFile>,
    bytes: u64,
    has_skill_md: bool,
    /// Why this directory cannot be the skill (reported only if it is chosen).
    problem: Option<String>,
}

impl Candidate {
    fn new(prefix: String) -> Candidate {
        Candidate {
            prefix,
            files: BTreeMap::new(),
            bytes: 0,
            has_skill_md: false,
            problem: None,
        }
    }
}

/// A reader failing past `left` bytes (a decompression bomb guard).
pub(super) struct Limited<R> {
    pub(super) inner: R,
    pub(super) left: u64,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::other(format!(
                "the tarball unpacks to more than {MAX_UNPACKED_BYTES} bytes"
            ))
        })?;
        Ok(n)
    }
}

/// Why an entry `path` is refused, if it is.
pub(crate) fn unsafe_path(path: &Path) -> Option<&'static str> {
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Some("an absolute path"),
            Component::ParentDir => return Some("a `..` component"),
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    None
}

/// What an entry type is called in errors.
pub(super) fn kind_name(kind: tar::EntryType) -> String {
    match kind {
        tar::EntryType::Symlink => "a symbolic link".into(),
        tar::EntryType::Link => "a hard link".into(),
        tar::EntryType::Char => "a character device".into(),
        tar::EntryType::Block => "a block device".into(),
        tar::EntryType::Fifo => "a FIFO".into(),
        other => format!("a {other:?} entry"),
    }
}

/// The commit a pax global header's `comment` names (`git archive` writes it).
pub(super) fn global_commit<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<String> {
    let exts = entry.pax_extensions().ok()??;
    for ext in exts.flatten() {
        if ext.key() == Ok("comment") {
            let v = ext.value().ok()?.trim();
            return is_full_sha(v).then(|| v.to_ascii_lowercase());
        }
    }
    None
}

/// Reads the gzipped GitHub tarball `tgz` and takes `r`'s skill subtree out of it.
pub(crate) fn extract(tgz: impl Read, r: &RemoteRef) -> Result<Extracted, String> {
    let mut cands = match &r.skill {
        Some(s) => vec![
            Candidate::new(format!("skills/{s}/")),
            Candidate::new(format!("{s}/")),
        ],
        None => vec![Candidate::new(String::new())],
    };
    let reader = Limited {
        inner: flate2::read::GzDecoder::new(BufReader::new(tgz)),
        left: MAX_UNPACKED_BYTES,
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| format!("the tarball is not a gzipped tar: {e}"))?;
    let mut top: Option<std::ffi::OsString> = None;
    let mut commit = None;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(format!("the tarball has more than {MAX_ENTRIES} entries"));
        }
        let mut entry = entry.map_err(|e| format!("reading tarball entry {n}: {e}"))?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            if commit.is_none() {
                commit = global_commit(&mut entry);
            }
            continue;
        }
        let path = entry
            .path()
            .map_err(|e| format!("tarball entry {n}: {e}"))?
            .into_owned();
        if let Some(why) = unsafe_path(&path) {
            return Err(format!("the tarball entry `{}` has {why}", path.display()));
        }
        let mut parts = path.components().filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        });
        let Some(first) = parts.next() else { continue };
        match &top {
            None => top = Some(first.to_owned()),
            Some(t) if t.as_os_str() != first => {
                return Err(format!(
                    "the tarball has more than one top-level directory (`{}` and `{}`)",
                    t.to_string_lossy(),
                    first.to_string_lossy()
                ))
            }
            Some(_) => {}
        }
        let rest: Vec<&OsStr> = parts.collect();
        if rest.is_empty() {
            continue;
        }
        let utf8 = rest.iter().all(|p| p.to_str().is_some());
        let rel = rest
            .iter()
            .map(|p| p.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        offer(&mut cands, &rel, utf8, &mut entry)?;
    }
    let Some(chosen) = cands.into_iter().find(|c| c.has_skill_md) else {
        return Err(match &r.skill {
            Some(s) => format!(
                "{}/{} at `{}` has neither `skills/{s}/SKILL.md` nor `{s}/SKILL.md`",
                r.owner,
                r.repo,
                r.reference_or_head()
            ),
            None => format!(
                "{}/{} at `{}` has no `SKILL.md` at the repository root",
                r.owner,
                r.repo,
                r.reference_or_head()
            ),
        });
    };
    if let Some(p) = chosen.problem {
        return Err(p);
    }
    Ok(Extracted {
        commit,
        files: chosen.files.into_values().collect(),
    })
}

/// Offers the tarball entry `rel` (`utf8`: its name is UTF-8) to every candidate skill
/// directory that holds it; its bytes are read once, by the first candidate that keeps it.
/// A candidate records why it cannot be the skill instead of failing the whole extraction
/// (another candidate may be the one).
fn offer<R: Read>(
    cands: &mut [Candidate],
    rel: &str,
    utf8: bool,
    entry: &mut tar::Entry<'_, R>,
) -> Result<(), String> {
    let kind = entry.header().entry_type();
    let mut data: Option<Vec<u8>> = None;
    for c in cands.iter_mut() {
        let Some(sub) = rel.strip_prefix(c.prefix.as_str()) else {
            continue;
        };
        if sub.is_empty() || sub.split('/').any(|p| p.starts_with('.')) {
            continue;
        }
        if sub == "SKILL.md" && !kind.is_dir() {
            c.has_skill_md = true;
        }
        if c.problem.is_some() || kind.is_dir() {
            continue;
        }
        if !utf8 {
            c.problem = Some(format!("`{rel}` has a name that is not UTF-8"));
            continue;
        }
        if !kind.is_file() {
            c.problem = Some(format!(
                "`{rel}` is {}: a skill may hold only regular files and directories",
                kind_name(kind)
            ));
            continue;
        }
        if c.files.contains_key(sub) {
            c.problem = Some(format!("`{rel}` appears twice in the tarball"));
            continue;
        }
        if c.files.len() >= MAX_FILES {
            c.problem = Some(format!(
                "`{}` has more than {MAX_FILES} files",
                c.prefix.trim_end_matches('/')
            ));
            continue;
        }
        let size = entry.size();
        if size > MAX_BYTES - c.bytes {
            c.problem = Some(format!("the skill is more than {MAX_BYTES} bytes"));
            continue;
        }
        let executable = entry.header().mode().map_err(|e| format!("`{rel}`: {e}"))? & 0o111 != 0;
        let bytes = match &data {
            Some(d) => d.clone(),
            None => {
                let mut d = Vec::with_capacity(size as usize);
                (&mut *entry)
                    .take(size)
                    .read_to_end(&mut d)
                    .map_err(|e| format!("reading `{rel}` from the tarball: {e}"))?;
                if d.len() as u64 != size {
                    return Err(format!(
                        "`{rel}`: {} bytes in the tarball, {size} expected",
                        d.len()
                    ));
                }
                data = Some(d.clone());
                d
            }
        };
        c.bytes += size;
        c.files.insert(
            sub.to_string(),
            TreeFile {
                path: sub.to_string(),
                executable,
                data: bytes,
            },
        );
    }
    Ok(())
}
