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

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{MAX_BYTES, MAX_FILES};

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
/// Longest REF accepted.
pub const MAX_REF_LEN: usize = 200;

/// Index file name used for a repository-root skill.
const ROOT_INDEX_NAME: &str = "_root";
/// Largest index file read.
const MAX_INDEX_BYTES: u64 = 64 << 10;

/// A parsed `remote:` skill reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRef {
    /// Repository owner.
    pub owner: String,
    /// Repository name.
    pub repo: String,
    /// Skill directory name; `None`: the repository root is the skill.
    pub skill: Option<String>,
    /// Branch, tag or commit; `None`: the default branch.
    pub reference: Option<String>,
}

impl RemoteRef {
    /// Parses `OWNER/REPO[/SKILL][@REF]` (the value after `remote:`).
    pub fn parse(value: &str) -> Result<RemoteRef, String> {
        let (path, reference) = match value.split_once('@') {
            Some((p, r)) => (p, Some(r)),
            None => (value, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(format!(
                "`{value}` is not `OWNER/REPO` or `OWNER/REPO/SKILL` (optionally followed by `@REF`)"
            ));
        }
        for (i, p) in parts.iter().enumerate() {
            if p.is_empty() {
                return Err(format!("`{value}` has an empty part"));
            }
            if !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!(
                    "`{p}` may only use letters, digits, `-`, `_` and `.`"
                ));
            }
            if *p == "." || *p == ".." || (i == 2 && p.starts_with('.')) {
                return Err(format!("`{p}` is not a valid name here"));
            }
        }
        if let Some(r) = reference {
            check_ref(r)?;
        }
        Ok(RemoteRef {
            owner: parts[0].to_string(),
            repo: parts[1].to_string(),
            skill: parts.get(2).map(|s| s.to_string()),
            reference: reference.map(str::to_string),
        })
    }

    /// The skill's name: the skill directory, else the repository.
    pub fn name(&self) -> &str {
        self.skill.as_deref().unwrap_or(&self.repo)
    }

    /// The REF fetched: the one given, else `HEAD`.
    pub fn reference_or_head(&self) -> &str {
        self.reference.as_deref().unwrap_or("HEAD")
    }

    /// Whether the REF is a full commit SHA (immutable, so served from the cache).
    pub fn is_commit(&self) -> bool {
        self.reference.as_deref().is_some_and(is_full_sha)
    }

    /// The same skill pinned to `commit`.
    fn pinned(&self, commit: &str) -> RemoteRef {
        RemoteRef {
            reference: Some(commit.to_string()),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for RemoteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.repo)?;
        if let Some(s) = &self.skill {
            write!(f, "/{s}")?;
        }
        if let Some(r) = &self.reference {
            write!(f, "@{r}")?;
        }
        Ok(())
    }
}

/// Checks a REF: 1-[`MAX_REF_LEN`] characters of `[A-Za-z0-9._/-]`, not starting with `-`,
/// no `..`, no empty `/`-separated part.
pub fn check_ref(r: &str) -> Result<(), String> {
    if r.is_empty() {
        return Err("nothing after `@` (expected a branch, tag or commit)".into());
    }
    if r.len() > MAX_REF_LEN {
        return Err(format!("ref is longer than {MAX_REF_LEN} characters"));
    }
    if !r
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Err(format!(
            "ref `{r}` may only use letters, digits, `.`, `_`, `/` and `-`"
        ));
    }
    if r.starts_with('-') {
        return Err(format!("ref `{r}` must not start with `-`"));
    }
    if r.contains("..") {
        return Err(format!("ref `{r}` must not contain `..`"));
    }
    if r.split('/').any(str::is_empty) {
        return Err(format!("ref `{r}` has an empty `/`-separated part"));
    }
    Ok(())
}

/// Whether `s` is a full (40 hex digit) commit SHA.
fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

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

/// An HTTP client for the GitHub API (rustls, ring provider).
fn client() -> Result<reqwest::Client, String> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/vnd.github+json"),
    );
    headers.insert(
        "X-GitHub-Api-Version",
        HeaderValue::from_static("2022-11-28"),
    );
    // Redirects (to codeload) keep to https (http only on loopback); reqwest drops the
    // Authorization header when the host changes.
    let policy = reqwest::redirect::Policy::custom(|a| {
        if a.previous().len() >= 10 {
            a.error("more than 10 redirects")
        } else if !allowed_url(a.url()) {
            let to = format!(
                "{}://{}",
                a.url().scheme(),
                a.url().host_str().unwrap_or("")
            );
            a.error(format!("refusing a redirect to {to}"))
        } else {
            a.follow()
        }
    });
    reqwest::Client::builder()
        .user_agent(concat!("voidbox/", env!("CARGO_PKG_VERSION")))
        .default_headers(headers)
        .redirect(policy)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(60))
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| format!("HTTP client: {}", chain(&e)))
}

/// An error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Why sending to `base` failed.
fn send_error(base: &str, e: reqwest::Error) -> String {
    let (connect, timeout) = (e.is_connect(), e.is_timeout());
    let why = chain(&e.without_url());
    if connect {
        format!("offline: could not reach {base}: {why}")
    } else if timeout {
        format!("timed out talking to {base}: {why}")
    } else {
        format!("fetching from {base}: {why}")
    }
}

/// The reason for an HTTP error `status` answering `url`.
fn status_error(
    status: u16,
    r: &RemoteRef,
    url: &str,
    rate_remaining: Option<&str>,
    has_token: bool,
) -> String {
    let token_hint = if has_token {
        format!("check the token in {TOKEN_ENV} or {GITHUB_TOKEN_ENV}")
    } else {
        format!("set {GITHUB_TOKEN_ENV} (or {TOKEN_ENV}) to a GitHub token")
    };
    match status {
        404 => {
            let private = if has_token {
                String::new()
            } else {
                format!("; a private repository needs a token: {token_hint}")
            };
            format!(
                "{}/{} (or ref `{}`) not found: {url} answered HTTP 404{private}",
                r.owner,
                r.repo,
                r.reference_or_head()
            )
        }
        401 => format!("GitHub refused the token: {url} answered HTTP 401; {token_hint}"),
        403 | 429 if status == 429 || rate_remaining == Some("0") => format!(
            "GitHub's API rate limit is exhausted: {url} answered HTTP {status}; {}",
            if has_token {
                "wait for the limit to reset".to_string()
            } else {
                format!("unauthenticated requests are limited to 60 an hour: {token_hint}")
            }
        ),
        403 => format!(
            "access denied: {url} answered HTTP 403 (the API rate limit may be exhausted, or the repository needs a token); {token_hint}"
        ),
        s => format!("{url} answered HTTP {s}"),
    }
}

/// Downloads `url` into `out`, at most [`MAX_TARBALL_BYTES`].
fn download(source: &RemoteSource, r: &RemoteRef, url: &str, out: &mut File) -> Result<(), String> {
    let client = client()?;
    let mut req = client.get(url);
    if let Some(t) = &source.token {
        let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| "the GitHub token is not a valid HTTP header value".to_string())?;
        v.set_sensitive(true);
        req = req.header(AUTHORIZATION, v);
    }
    let fut = async {
        let mut resp = req.send().await.map_err(|e| send_error(&source.base, e))?;
        let status = resp.status();
        if !status.is_success() {
            let remaining = resp
                .headers()
                .get("x-ratelimit-remaining")
                .and_then(|v| v.to_str().ok());
            return Err(status_error(
                status.as_u16(),
                r,
                url,
                remaining,
                source.token.is_some(),
            ));
        }
        if let Some(n) = resp.content_length().filter(|n| *n > MAX_TARBALL_BYTES) {
            return Err(format!(
                "the tarball is {n} bytes, more than the {MAX_TARBALL_BYTES} accepted"
            ));
        }
        let mut total = 0u64;
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                format!(
                    "reading the tarball after {total} bytes: {}",
                    chain(&e.without_url())
                )
            })?;
            let Some(chunk) = chunk else { break };
            total += chunk.len() as u64;
            if total > MAX_TARBALL_BYTES {
                return Err(format!(
                    "the tarball is more than the {MAX_TARBALL_BYTES} bytes accepted"
                ));
            }
            out.write_all(&chunk)
                .map_err(|e| format!("writing the tarball: {e}"))?;
        }
        out.flush().map_err(|e| format!("writing the tarball: {e}"))
    };
    crate::oci::block_on(fut).map_err(|e| e.to_string())?
}

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
struct Limited<R> {
    inner: R,
    left: u64,
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
fn kind_name(kind: tar::EntryType) -> String {
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
fn global_commit<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<String> {
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
            let executable =
                entry.header().mode().map_err(|e| format!("`{rel}`: {e}"))? & 0o111 != 0;
            let bytes = match &data {
                Some(d) => d.clone(),
                None => {
                    let mut d = Vec::with_capacity(size as usize);
                    (&mut entry)
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

fn is_sha256_hex(s: &str) -> bool {
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
fn tree_intact(dir: &Path, hex: &str) -> bool {
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

fn read_index(path: &Path) -> Option<IndexEntry> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(MAX_INDEX_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text).ok()
}

fn write_index(path: &Path, entry: &IndexEntry) -> Result<(), String> {
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

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;
