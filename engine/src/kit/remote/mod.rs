//! `remote:OWNER/REPO[/SKILL][@REF]` skills: fetched from GitHub as a repository tarball,
//! the skill's directory extracted into a content-addressed cache (issue 13, item 4).
//!
//! `OWNER/REPO/SKILL` is the directory `skills/SKILL/` of the repository at REF, else
//! `SKILL/` at its root (either must hold `SKILL.md`); `OWNER/REPO` is the repository root.
//! Without REF the default branch (`HEAD`) is fetched.
//!
//! ```text
//! <cache root>/skills/
//!   sha256/<hex>/                       a skill tree, named by its tree digest
//!   refs/<owner>/<repo>/<skill|_root>@<ref>.json
//!                                       {url, commit, sha256, fetched_at, skill}
//! ```
//!
//! A REF that is a full 40-hex commit SHA with an index entry is served from the cache with
//! no network at all; any other REF is fetched every time, and a failed fetch is an error
//! (never a silent fallback) that names a cached copy and its commit when there is one.
//!
//! Bounded: a tarball is at most [`MAX_TARBALL_BYTES`] (at most [`MAX_UNPACKED_BYTES`]
//! unpacked) and [`MAX_ENTRIES`] entries; a skill at most [`MAX_FILES`] files and
//! [`MAX_BYTES`] bytes. An entry with an absolute path or a `..` component refuses the whole
//! tarball; inside the skill only regular files and directories are accepted. Entries whose
//! name starts with `.` are skipped, as the kit does.

use std::fs;
use std::io::Seek;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{MAX_BYTES, MAX_FILES};

pub use voidbox_spec::skill_ref::{check_ref, is_full_sha, RemoteRef, MAX_REF_LEN};

mod cache;
mod extract;
mod http;

use cache::*;
use extract::*;
use http::*;

/// Environment variable naming the GitHub API base URL (tests point it at a local server).
pub const API_URL_ENV: &str = "VOIDBOX_GITHUB_API_URL";
/// Environment variable holding a GitHub token (preferred over [`GITHUB_TOKEN_ENV`]).
pub const TOKEN_ENV: &str = "VOIDBOX_GITHUB_TOKEN";
/// The conventional GitHub token variable.
pub const GITHUB_TOKEN_ENV: &str = "GITHUB_TOKEN";
/// The public GitHub REST API.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// Largest tarball accepted (compressed).
pub const MAX_TARBALL_BYTES: u64 = 64 << 20;
/// Most bytes a tarball may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;
/// Most entries a tarball may hold.
pub const MAX_ENTRIES: usize = 20_000;

/// Index file name used for a repository-root skill.
const ROOT_INDEX_NAME: &str = "_root";
/// Largest index file read.
const MAX_INDEX_BYTES: u64 = 64 << 10;

/// Where remote skills come from and are cached.
#[derive(Clone)]
pub struct RemoteSource {
    base: String,
    token: Option<String>,
    dir: PathBuf,
}

impl std::fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSource")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("dir", &self.dir)
            .finish()
    }
}

impl RemoteSource {
    /// The source named by `env` ([`API_URL_ENV`], [`TOKEN_ENV`], else [`GITHUB_TOKEN_ENV`]),
    /// caching under `<cache_root>/skills` (default: the image cache's root).
    pub fn from_env(
        env: &dyn Fn(&str) -> Option<String>,
        cache_root: Option<&Path>,
    ) -> Result<RemoteSource, String> {
        let set = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let base = match set(API_URL_ENV) {
            Some(v) => check_base(&v)?,
            None => DEFAULT_API_URL.to_string(),
        };
        let token = set(TOKEN_ENV).or_else(|| set(GITHUB_TOKEN_ENV));
        let root = match cache_root {
            Some(r) => r.to_path_buf(),
            None => crate::image::cache::Cache::default_root().map_err(|e| e.to_string())?,
        };
        Ok(RemoteSource {
            base,
            token,
            dir: root.join("skills"),
        })
    }

    /// The API base URL (no trailing `/`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether a token is sent.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The cache directory (`<cache root>/skills`).
    pub fn cache_dir(&self) -> &Path {
        &self.dir
    }

    /// The tarball URL of `r` (never holds the token).
    pub fn tarball_url(&self, r: &RemoteRef) -> String {
        format!(
            "{}/repos/{}/{}/tarball/{}",
            self.base,
            r.owner,
            r.repo,
            r.reference_or_head()
        )
    }

    /// The index file of `r` at its REF.
    fn index_path(&self, r: &RemoteRef) -> PathBuf {
        let name = format!(
            "{}@{}.json",
            r.skill.as_deref().unwrap_or(ROOT_INDEX_NAME),
            r.reference_or_head().replace('/', "%2F")
        );
        self.dir
            .join("refs")
            .join(&r.owner)
            .join(&r.repo)
            .join(name)
    }

    /// `message` with the token (if any) blanked out.
    fn scrub(&self, message: String) -> String {
        match &self.token {
            Some(t) if !t.is_empty() => message.replace(t.as_str(), "<token>"),
            _ => message,
        }
    }

    /// The cached skill `r`'s index names, if the index and its intact tree exist.
    fn cached(&self, r: &RemoteRef) -> Option<(IndexEntry, PathBuf)> {
        let entry = read_index(&self.index_path(r))?;
        if entry.skill != r.skill || !is_sha256_hex(&entry.sha256) {
            return None;
        }
        let dir = self.dir.join("sha256").join(&entry.sha256);
        tree_intact(&dir, &entry.sha256).then_some((entry, dir))
    }
}

/// The API base from [`API_URL_ENV`]: `https://`, or `http://` on a loopback host.
fn check_base(v: &str) -> Result<String, String> {
    let bad = |why: &str| format!("{API_URL_ENV}=`{v}` {why}");
    let url = url::Url::parse(v).map_err(|e| bad(&format!("is not a URL: {e}")))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{API_URL_ENV} must not hold credentials (use {TOKEN_ENV})"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("must not have a query or fragment"));
    }
    if !allowed_url(&url) {
        return Err(bad(
            "must be an https:// URL (http:// only for a loopback host)",
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// `https://`, or `http://` to a loopback host.
fn allowed_url(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

/// A fetched skill: its directory in the cache (holds SKILL.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedSkill {
    /// `<cache>/skills/sha256/<sha256>`.
    pub dir: PathBuf,
    /// The tree digest (see [`tree_digest`]).
    pub sha256: String,
    /// The commit the tarball was made from, when it says so.
    pub commit: Option<String>,
    /// The tarball URL (never holds the token).
    pub url: String,
    /// Served from the cache, without the network.
    pub from_cache: bool,
}

/// Why a fetch failed (Display: a one-line reason; never the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("skill `{skill}`: {message}")]
pub struct RemoteError {
    /// The skill as written (`remote:…`).
    pub skill: String,
    /// What went wrong.
    pub message: String,
}

/// One ref index file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IndexEntry {
    url: String,
    commit: Option<String>,
    sha256: String,
    fetched_at: String,
    /// The skill directory (`None`: the repository root), guarding `_root` name clashes.
    #[serde(default)]
    skill: Option<String>,
}

/// Fetches `r` (blocking): from the cache for a pinned commit already there, else from
/// GitHub, storing the skill tree and its ref index entries in the cache.
pub fn fetch(source: &RemoteSource, r: &RemoteRef) -> Result<FetchedSkill, RemoteError> {
    let fail = |message: String| RemoteError {
        skill: format!("remote:{r}"),
        message: source.scrub(message).replace('\n', " "),
    };
    if r.is_commit() {
        if let Some((entry, dir)) = source.cached(r) {
            return Ok(FetchedSkill {
                dir,
                sha256: entry.sha256,
                commit: entry.commit,
                url: entry.url,
                from_cache: true,
            });
        }
    }
    let url = source.tarball_url(r);
    fetch_and_store(source, r, &url).map_err(|why| {
        let hint = match source.cached(r) {
            Some((IndexEntry {
                commit: Some(c),
                fetched_at,
                ..
            }, _)) => format!(
                "; a cached copy of commit {c} (fetched {fetched_at}) exists: pin `remote:{}` to use it offline",
                r.pinned(&c)
            ),
            Some((e, _)) => format!(
                "; a cached copy (fetched {}) exists, but its commit is unknown, so it cannot be pinned",
                e.fetched_at
            ),
            None => String::new(),
        };
        fail(format!("{why}{hint}"))
    })
}

/// Downloads, extracts and stores `r`, writing its index entries.
fn fetch_and_store(
    source: &RemoteSource,
    r: &RemoteRef,
    url: &str,
) -> Result<FetchedSkill, String> {
    fs::create_dir_all(&source.dir)
        .map_err(|e| format!("creating {}: {e}", source.dir.display()))?;
    let mut tgz = tempfile::tempfile_in(&source.dir)
        .map_err(|e| format!("a temporary file in {}: {e}", source.dir.display()))?;
    download(source, r, url, &mut tgz)?;
    tgz.rewind()
        .map_err(|e| format!("rereading the tarball: {e}"))?;
    let extracted = extract(tgz, r)?;
    if let (Some(want), Some(got)) = (r.reference.as_deref(), extracted.commit.as_deref()) {
        if is_full_sha(want) && !want.eq_ignore_ascii_case(got) {
            return Err(format!(
                "asked for commit {want}, the tarball is of commit {got}"
            ));
        }
    }
    let (sha256, dir) = install(&source.dir.join("sha256"), &extracted.files)?;
    let entry = IndexEntry {
        url: url.to_string(),
        commit: extracted.commit.clone(),
        sha256: sha256.clone(),
        fetched_at: rfc3339(SystemTime::now()),
        skill: r.skill.clone(),
    };
    write_index(&source.index_path(r), &entry)?;
    if let Some(c) = &extracted.commit {
        if r.reference.as_deref() != Some(c.as_str()) {
            write_index(&source.index_path(&r.pinned(c)), &entry)?;
        }
    }
    Ok(FetchedSkill {
        dir,
        sha256,
        commit: extracted.commit,
        url: url.to_string(),
        from_cache: false,
    })
}

#[cfg(test)]
mod tests;
