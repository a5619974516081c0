//! The golden snapshot cache.
//!
//! ```text
//! $XDG_CACHE_HOME/voidbox/snapshots/        (fallback ~/.cache/voidbox/snapshots)
//!   <key>/            state.snap + memory.bin (written by the VMM), secret, meta.json
//!   <key>/            a layered entry (`meta.base` names its base): state.snap +
//!                     memory.diff (only the pages that differ from the base's memory)
//!   locks/<key>.lock  flock(2): shared while a VM restores from the entry, exclusive
//!                     while it is created or removed
//!   tmp/              staging dirs (same filesystem, so entries appear by rename)
//! ```
//!
//! An entry's last use is the mtime of its `meta.json`; the cache is kept under a size cap
//! by evicting the least recently used entries that no VM is restoring from. Layers are one
//! level deep (a base is a full snapshot) and never broken apart: a base with diffs is only
//! removed with them, a shared lock on a diff also holds its base, and eviction removes a
//! base only together with its diffs.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use voidbox_protocol::SessionSecret;

use crate::image::cache::{is_hash, open_lock_file, remove_dir_atomically, try_flock, PrefixOf};
use crate::image::Cache;
use crate::sandbox::RestoreFrom;

/// Metadata file of an entry.
pub const META_FILE: &str = "meta.json";
/// Session secret of the snapshotted guest (hex, mode 0600).
pub const SECRET_FILE: &str = "secret";
/// Default size cap of the cache (bytes allocated on disk).
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;
/// Environment variable overriding the size cap (`512MiB`, `4GiB`, bytes).
pub const MAX_BYTES_ENV: &str = "VOIDBOX_SNAPSHOT_CACHE_MAX";
/// Memory of a layered entry: the pages that differ from its base's `memory.bin`.
pub const DIFF_FILE: &str = "memory.diff";
/// Largest `meta.json` read.
const MAX_META_BYTES: u64 = 64 * 1024;

/// The first 12 characters of a key (as `voidbox snapshot ls` shows it).
fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

/// Errors of the snapshot cache.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// No entry matches, or a prefix is ambiguous.
    #[error("{0}")]
    NotFound(String),
    /// An entry is unreadable or incomplete.
    #[error("snapshot {}: {why}", dir.display())]
    Invalid {
        /// The entry.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A VM is restoring from the entry.
    #[error("snapshot {0} is in use by a running VM")]
    Busy(String),
    /// A layered entry whose base cannot serve it.
    #[error(
        "snapshot {} is a diff over the base snapshot {}, which {why}\n  help: remove it with `voidbox snapshot rm {}` (it will be recreated)",
        short(key),
        short(base),
        short(key)
    )]
    BaseMissing {
        /// The diff entry.
        key: String,
        /// Its base.
        base: String,
        /// What is wrong with the base.
        why: String,
    },
    /// Removing a base that diff entries still need.
    #[error(
        "snapshot {} is the base of {} diff snapshot(s) ({}), which cannot restore without it\n  help: `voidbox snapshot rm {} --with-dependents` removes them all",
        short(key),
        dependents.len(),
        dependents.iter().map(|d| short(d)).collect::<Vec<_>>().join(", "),
        short(key)
    )]
    HasDependents {
        /// The base.
        key: String,
        /// The diffs over it.
        dependents: Vec<String>,
    },
    /// No cache location.
    #[error("{0}")]
    Environment(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a snapshot was taken of, and what taking it cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// Cache key (the entry's directory name).
    pub key: String,
    /// Guest image hash.
    pub image_hash: String,
    /// Image + command-line identity the VMM checks on restore.
    pub image_key: String,
    /// Extra kernel parameters the guest booted with.
    pub extra_cmdline: Vec<String>,
    /// The VM had a network device (absent in entries without one, as before networking).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// Guest memory in MiB.
    pub memory_mb: u32,
    /// vCPUs.
    pub vcpus: u8,
    /// Creation time (seconds since the epoch).
    pub created_unix: u64,
    /// voidbox version that wrote it.
    pub voidbox_version: String,
    /// Cold boot to authenticated agent, ms.
    pub boot_ms: u64,
    /// Snapshot request to files written, ms.
    pub snapshot_ms: u64,
    /// vCPUs paused, µs.
    pub pause_us: u64,
    /// State blob bytes.
    pub state_bytes: u64,
    /// For a layered entry: the key of the base entry (a full snapshot in the same cache)
    /// whose memory this entry's [`DIFF_FILE`] overlays. Absent in full snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// For a warm-runtime snapshot: what runs in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmMeta>,
}

impl Meta {
    /// What the entry is, for listings: `golden`, or `warm <runtime>[ <model>]`.
    pub fn kind(&self) -> String {
        match &self.warm {
            None if self.base.is_some() => "diff".to_string(),
            None => "golden".to_string(),
            Some(w) => match &w.model {
                Some(m) => format!("warm {} {m}", w.runtime),
                None => format!("warm {}", w.runtime),
            },
        }
    }
}

/// What a warm-runtime snapshot holds: an agent runtime started and blocked on its input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmMeta {
    /// The runtime (`claude-code`, `codex`).
    pub runtime: String,
    /// The provider its gateway speaks to.
    pub provider: String,
    /// The model it was started with, if one was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Hash of the skills kit installed in it.
    pub kit_hash: String,
    /// How long the runtime took to settle (blocked on its input), ms.
    pub settle_ms: u64,
    /// Bytes of the memory diff.
    pub diff_bytes: u64,
}

/// A cache entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its directory.
    pub dir: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// Last restore (or creation).
    pub last_used: SystemTime,
    /// Bytes allocated on disk.
    pub disk_bytes: u64,
}

impl Entry {
    /// Reads an entry directory (any directory with voidbox snapshot files, in the cache or
    /// not).
    pub fn load(dir: &Path) -> Result<Entry, StoreError> {
        let invalid = |why: String| StoreError::Invalid {
            dir: dir.to_path_buf(),
            why,
        };
        let meta_path = dir.join(META_FILE);
        let f = File::open(&meta_path).map_err(|e| invalid(format!("{META_FILE}: {e}")))?;
        let last_used = f
            .metadata()
            .and_then(|m| m.modified())
            .map_err(|e| invalid(format!("{META_FILE}: {e}")))?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_META_BYTES), &mut text)
            .map_err(|e| invalid(format!("{META_FILE}: {e}")))?;
        let meta: Meta =
            serde_json::from_str(&text).map_err(|e| invalid(format!("{META_FILE}: {e}")))?;
        let memory = match &meta.base {
            None => voidbox_vmm::persist::format::MEMORY_FILE,
            Some(b) if is_hash(b) && *b != meta.key => DIFF_FILE,
            Some(b) => {
                return Err(invalid(format!(
                    "{META_FILE}: base `{}` is not another snapshot's key",
                    b.escape_debug()
                )))
            }
        };
        for f in [
            voidbox_vmm::persist::format::STATE_FILE,
            memory,
            SECRET_FILE,
        ] {
            if !dir.join(f).is_file() {
                return Err(invalid(format!("{f} is missing")));
            }
        }
        Ok(Entry {
            dir: dir.to_path_buf(),
            disk_bytes: disk_usage(dir),
            meta,
            last_used,
        })
    }

    /// The directory of this entry's base (a sibling of its own directory), for a layered
    /// entry.
    pub fn base_dir(&self) -> Option<PathBuf> {
        let base = self.meta.base.as_ref()?;
        Some(match self.dir.parent() {
            Some(p) => p.join(base),
            None => PathBuf::from(base),
        })
    }

    /// What a VM needs to restore from this entry (reads the secret). For a layered entry,
    /// `base` is its base's directory, checked to hold a full snapshot of the same VM.
    pub fn restore_from(&self) -> Result<RestoreFrom, StoreError> {
        let base = match self.base_dir() {
            None => None,
            Some(dir) => {
                self.check_base(&dir)?;
                Some(dir)
            }
        };
        let path = self.dir.join(SECRET_FILE);
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        let secret = SessionSecret::from_hex(&text).map_err(|e| StoreError::Invalid {
            dir: self.dir.clone(),
            why: format!("{SECRET_FILE}: {e}"),
        })?;
        Ok(RestoreFrom {
            dir: self.dir.clone(),
            secret,
            base,
        })
    }

    /// Checks that `dir`, this entry's base, holds a full snapshot of the same VM.
    fn check_base(&self, dir: &Path) -> Result<(), StoreError> {
        let missing = |why: String| StoreError::BaseMissing {
            key: self.meta.key.clone(),
            base: self.meta.base.clone().unwrap_or_default(),
            why,
        };
        if !dir.exists() {
            return Err(missing("is missing".into()));
        }
        let base = Entry::load(dir).map_err(|e| missing(format!("cannot be read ({e})")))?;
        let (m, b) = (&self.meta, &base.meta);
        if b.base.is_some() {
            return Err(missing("is itself a diff".into()));
        }
        if (b.memory_mb, b.vcpus, &b.image_key) != (m.memory_mb, m.vcpus, &m.image_key) {
            return Err(missing(format!(
                "is of another VM ({} MiB, {} vCPU(s), image {}; the diff: {} MiB, {} vCPU(s), image {})",
                b.memory_mb,
                b.vcpus,
                short(&b.image_key),
                m.memory_mb,
                m.vcpus,
                short(&m.image_key)
            )));
        }
        Ok(())
    }
}

/// Reads only the `meta.json` of the entry in `dir`.
fn read_meta(dir: &Path) -> Option<Meta> {
    let f = File::open(dir.join(META_FILE)).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_META_BYTES), &mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Bytes allocated by the files directly in `dir`.
pub fn disk_usage(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// Writes `secret` and `meta` into a staging directory.
pub fn write_entry_files(
    dir: &Path,
    secret: &SessionSecret,
    meta: &Meta,
) -> Result<(), StoreError> {
    let path = dir.join(SECRET_FILE);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(&path))?;
    f.write_all(secret.to_hex().as_bytes()).map_err(io(&path))?;
    f.sync_all().map_err(io(&path))?;
    let path = dir.join(META_FILE);
    let json = serde_json::to_vec_pretty(meta).map_err(|e| StoreError::Invalid {
        dir: dir.to_path_buf(),
        why: e.to_string(),
    })?;
    fs::write(&path, json).map_err(io(&path))
}

/// How an entry lock is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Restoring from the entry (many at once).
    Shared,
    /// Creating or removing it.
    Exclusive,
}

/// A held entry lock, released when dropped. A shared lock of a layered entry also holds
/// its base's.
#[derive(Debug)]
pub struct EntryLock {
    _file: File,
    _base: Option<Box<EntryLock>>,
}

impl EntryLock {
    /// Writes this process's pid into the lock file (with the exclusive lock held), for
    /// [`Store::lock_holder`]: someone waiting can say whom it waits for.
    pub fn record_holder(&self) {
        use std::io::{Seek, Write};
        let mut f = &self._file;
        let _ = f.set_len(0);
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = write!(f, "{}", std::process::id());
    }
}

/// Why the golden snapshot cache at `snapshots` (`<cache>/snapshots`) cannot be written by
/// this process, and the fix; `None` when it can. Each directory a VM start writes
/// (`snapshots/`, `snapshots/locks/`) is tried with a file created and removed there, or,
/// where it does not exist yet, in its nearest existing ancestor (where it would be made).
/// `voidbox doctor` and every `apply`/`run`/`shell` (once, before any VM) ask this.
pub fn write_problem(snapshots: &Path) -> Option<(String, String)> {
    for dir in [snapshots.to_path_buf(), snapshots.join("locks")] {
        let mut at = dir.as_path();
        while std::fs::symlink_metadata(at).is_err() {
            at = at.parent()?;
        }
        let probe = at.join(format!(".voidbox-write-test-{}", std::process::id()));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe);
        match made {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
            }
            Err(e) => {
                let root = snapshots.parent().unwrap_or(snapshots);
                let why = format!(
                    "the cache {} is not writable (creating a file in {}: {e})",
                    root.display(),
                    at.display()
                );
                let fix = format!(
                    "make {} a directory this user can write (`sudo chown -R $(id -u):$(id -g) {}`), \
                     or point XDG_CACHE_HOME at one",
                    root.display(),
                    root.display()
                );
                return Some((why, fix));
            }
        }
    }
    None
}

/// The snapshot cache.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The cache at `root`, or `snapshots/` under the voidbox cache directory.
    pub fn open(root: Option<&Path>) -> Result<Store, StoreError> {
        Ok(match root {
            Some(r) => Store {
                root: r.to_path_buf(),
            },
            None => Store {
                root: Cache::default_root()
                    .map_err(|e| StoreError::Environment(e.to_string()))?
                    .join("snapshots"),
            },
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<key>/`.
    pub fn entry_dir(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn private_dir(&self, sub: &str) -> Result<PathBuf, StoreError> {
        let p = self.root.join(sub);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
            .map_err(io(&p))?;
        Ok(p)
    }

    /// A fresh staging directory under `tmp/` (mode 0700; removed when dropped).
    pub fn staging(&self) -> Result<tempfile::TempDir, StoreError> {
        let tmp = self.private_dir("tmp")?;
        tempfile::Builder::new()
            .prefix("staging-")
            .tempdir_in(&tmp)
            .map_err(io(&tmp))
    }

    /// Takes the lock of `key`. With `wait == false`, returns `None` when it is held in a
    /// conflicting mode. A shared lock of a layered entry also takes (and holds) the shared
    /// lock of its base, so that the base is not removed while a VM restores from the diff;
    /// `None` when that one conflicts.
    pub fn lock(
        &self,
        key: &str,
        mode: LockMode,
        wait: bool,
    ) -> Result<Option<EntryLock>, StoreError> {
        let Some(mut lock) = self.lock_one(key, mode, wait)? else {
            return Ok(None);
        };
        if mode == LockMode::Shared {
            let base = read_meta(&self.entry_dir(key)).and_then(|m| m.base);
            if let Some(b) = base.filter(|b| is_hash(b) && b != key) {
                match self.lock_one(&b, LockMode::Shared, wait)? {
                    Some(l) => lock._base = Some(Box::new(l)),
                    None => return Ok(None),
                }
            }
        }
        Ok(Some(lock))
    }

    /// Takes the lock of `key` alone.
    fn lock_one(
        &self,
        key: &str,
        mode: LockMode,
        wait: bool,
    ) -> Result<Option<EntryLock>, StoreError> {
        use rustix::fs::FlockOperation as Op;
        let dir = self.private_dir("locks")?;
        let path = dir.join(format!("{key}.lock"));
        let file = open_lock_file(&path, 0o600).map_err(io(&path))?;
        let op = match (mode, wait) {
            (LockMode::Shared, true) => Op::LockShared,
            (LockMode::Shared, false) => Op::NonBlockingLockShared,
            (LockMode::Exclusive, true) => Op::LockExclusive,
            (LockMode::Exclusive, false) => Op::NonBlockingLockExclusive,
        };
        Ok(try_flock(&file, op)
            .map_err(io(&path))?
            .then_some(EntryLock {
                _file: file,
                _base: None,
            }))
    }

    /// The pid that last held `key`'s exclusive lock ([`EntryLock::record_holder`]), and its
    /// command line when it still runs; `None` when unknown.
    pub fn lock_holder(&self, key: &str) -> Option<(u32, Option<String>)> {
        let path = self.root.join("locks").join(format!("{key}.lock"));
        let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok().map(|c| {
            c.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        });
        Some((pid, cmd))
    }

    /// The entry for `key`, if there is a complete one.
    pub fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let dir = self.entry_dir(key);
        if !dir.exists() {
            return Ok(None);
        }
        Entry::load(&dir).map(Some)
    }

    /// Marks `key` as just used (LRU order).
    pub fn touch(&self, key: &str) {
        let path = self.entry_dir(key).join(META_FILE);
        if let Ok(f) = OpenOptions::new().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Moves a finished staging directory into place as `key` (replacing a stale entry, and
    /// the diffs over it: they overlay the memory it had). Call with the exclusive lock of
    /// `key` held.
    pub fn install(&self, staging: tempfile::TempDir, key: &str) -> Result<Entry, StoreError> {
        let dest = self.entry_dir(key);
        let tmp = self.private_dir("tmp")?;
        if dest.exists() {
            // No VM restores from them: their shared locks would hold `key`'s.
            for d in self.dependents_deep(key).iter().rev() {
                let Some(_l) = self.lock_one(d, LockMode::Exclusive, false)? else {
                    return Err(StoreError::Busy(d.clone()));
                };
                self.remove_dir(d)?;
            }
        }
        remove_dir_atomically(&dest, &tmp).map_err(|e| StoreError::Environment(e.to_string()))?;
        let staged = staging.keep();
        fs::rename(&staged, &dest).map_err(io(&dest))?;
        Entry::load(&dest)
    }

    /// Every entry, most recently used first, and unreadable entry dirs with why.
    #[allow(clippy::type_complexity)]
    pub fn list(&self) -> Result<(Vec<Entry>, Vec<(PathBuf, StoreError)>), StoreError> {
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !is_hash(name) || !e.path().is_dir() {
                continue;
            }
            match Entry::load(&e.path()) {
                Ok(entry) => good.push(entry),
                Err(err) => bad.push((e.path(), err)),
            }
        }
        good.sort_by_key(|e: &Entry| std::cmp::Reverse(e.last_used));
        Ok((good, bad))
    }

    /// Keys of every entry directory (readable or not).
    fn keys(&self) -> Vec<String> {
        fs::read_dir(&self.root)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|n| is_hash(n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Resolves a unique key prefix.
    pub fn resolve(&self, prefix: &str) -> Result<String, StoreError> {
        const SNAPSHOTS: PrefixOf = PrefixOf {
            key: "snapshot key",
            noun: "snapshot",
            hint: " (see `voidbox snapshot ls`)",
        };
        let prefix = SNAPSHOTS.check(prefix).map_err(StoreError::NotFound)?;
        let found = self
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(&prefix))
            .collect();
        SNAPSHOTS
            .unique(&prefix, found)
            .map_err(StoreError::NotFound)
    }

    /// Keys of the entries whose `meta.base` is `key` (the diffs over it), sorted.
    pub fn dependents(&self, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .keys()
            .into_iter()
            .filter(|k| k != key)
            .filter(|k| {
                read_meta(&self.entry_dir(k)).is_some_and(|m| m.base.as_deref() == Some(key))
            })
            .collect();
        v.sort();
        v
    }

    /// The dependents of `key`, theirs, and so on (each once, never `key`), nearest first.
    fn dependents_deep(&self, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        let mut next = self.dependents(key);
        loop {
            for d in next {
                if d != key && !out.contains(&d) {
                    out.push(d);
                }
            }
            let Some(k) = out.get(i) else { break };
            next = self.dependents(k);
            i += 1;
        }
        out
    }

    /// Deletes `key`'s directory (call with its exclusive lock held).
    fn remove_dir(&self, key: &str) -> Result<(), StoreError> {
        let tmp = self.private_dir("tmp")?;
        remove_dir_atomically(&self.entry_dir(key), &tmp)
            .map_err(|e| StoreError::Environment(e.to_string()))
    }

    /// Removes one entry; refused while a VM restores from it (or from a diff over it) and
    /// while diffs over it exist ([`StoreError::HasDependents`]: see
    /// [`Store::remove_with_dependents`]).
    pub fn remove(&self, key: &str) -> Result<(), StoreError> {
        let Some(_lock) = self.lock(key, LockMode::Exclusive, false)? else {
            return Err(StoreError::Busy(key.to_string()));
        };
        let dependents = self.dependents(key);
        if !dependents.is_empty() {
            return Err(StoreError::HasDependents {
                key: key.to_string(),
                dependents,
            });
        }
        self.remove_dir(key)
    }

    /// Removes `key` and every diff over it; refused, removing nothing, while a VM restores
    /// from any of them. Returns the removed keys, diffs first.
    pub fn remove_with_dependents(&self, key: &str) -> Result<Vec<String>, StoreError> {
        // A VM restoring from a diff holds its base's shared lock too.
        let Some(_lock) = self.lock(key, LockMode::Exclusive, false)? else {
            return Err(StoreError::Busy(key.to_string()));
        };
        let deps = self.dependents_deep(key);
        let mut locks = Vec::with_capacity(deps.len());
        for d in &deps {
            match self.lock_one(d, LockMode::Exclusive, false)? {
                Some(l) => locks.push(l),
                None => return Err(StoreError::Busy(d.clone())),
            }
        }
        let mut removed = Vec::with_capacity(deps.len() + 1);
        for d in deps.iter().rev() {
            self.remove_dir(d)?;
            removed.push(d.clone());
        }
        self.remove_dir(key)?;
        removed.push(key.to_string());
        Ok(removed)
    }

    /// Evicts least recently used entries (never `keep` nor, for a diff, its base; never one
    /// in use) until the cache uses at most `max_bytes`. Diffs whose base is gone go first;
    /// a base goes only with its diffs, when it and they are the least recently used (a
    /// base's last use is its diffs' latest). Returns the evicted keys.
    pub fn evict(&self, max_bytes: u64, keep: &str) -> Vec<String> {
        let Ok((entries, _)) = self.list() else {
            return Vec::new();
        };
        let by_key: std::collections::HashMap<&str, &Entry> =
            entries.iter().map(|e| (e.meta.key.as_str(), e)).collect();
        let is_full = |k: &str| by_key.get(k).is_some_and(|e| e.meta.base.is_none());
        let keep_base = by_key.get(keep).and_then(|e| e.meta.base.as_deref());
        // (last use, key, whether it goes with its dependents)
        let mut candidates: Vec<(SystemTime, &str, bool)> = entries
            .iter()
            .map(|e| match e.meta.base.as_deref() {
                Some(b) if is_full(b) => (e.last_used, e.meta.key.as_str(), false),
                // Useless without its base.
                Some(_) => (SystemTime::UNIX_EPOCH, e.meta.key.as_str(), false),
                None => {
                    let latest = entries
                        .iter()
                        .filter(|d| d.meta.base.as_deref() == Some(e.meta.key.as_str()))
                        .map(|d| d.last_used)
                        .fold(e.last_used, SystemTime::max);
                    (latest, e.meta.key.as_str(), true)
                }
            })
            .collect();
        candidates.sort_by_key(|c| c.0);
        let mut total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
        let mut evicted = Vec::new();
        for (_, key, with_dependents) in candidates {
            if total <= max_bytes {
                break;
            }
            if key == keep || Some(key) == keep_base || evicted.iter().any(|k| k == key) {
                continue;
            }
            let removed = if with_dependents {
                self.remove_with_dependents(key)
            } else {
                self.remove(key).map(|()| vec![key.to_string()])
            };
            for k in removed.unwrap_or_default() {
                let bytes = by_key.get(k.as_str()).map_or(0, |e| e.disk_bytes);
                total = total.saturating_sub(bytes);
                evicted.push(k);
            }
        }
        evicted
    }
}

/// The cache size cap: [`MAX_BYTES_ENV`] or [`DEFAULT_MAX_BYTES`].
pub fn max_bytes() -> Result<u64, String> {
    match std::env::var(MAX_BYTES_ENV) {
        Ok(v) => crate::units::parse_size(&v).map_err(|e| format!("{MAX_BYTES_ENV}: {e}")),
        Err(_) => Ok(DEFAULT_MAX_BYTES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str) -> Meta {
        Meta {
            key: key.into(),
            image_hash: "i".into(),
            image_key: "k".into(),
            extra_cmdline: vec![],
            network: false,
            memory_mb: 128,
            vcpus: 1,
            created_unix: 1,
            voidbox_version: "0".into(),
            boot_ms: 1,
            snapshot_ms: 1,
            pause_us: 1,
            state_bytes: 1,
            base: None,
            warm: None,
        }
    }

    fn put(store: &Store, key: &str, bytes: usize) -> Entry {
        let _x = store.lock(key, LockMode::Exclusive, true).unwrap();
        let st = store.staging().unwrap();
        fs::write(st.path().join("state.snap"), b"s").unwrap();
        fs::write(st.path().join("memory.bin"), vec![1u8; bytes]).unwrap();
        let secret = SessionSecret::from_bytes([7; 32]);
        write_entry_files(st.path(), &secret, &meta(key)).unwrap();
        store.install(st, key).unwrap()
    }

    fn key(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    #[test]
    fn install_list_resolve_and_secret() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        let e = put(&store, &key('a'), 4096);
        assert_eq!(e.meta.memory_mb, 128);
        let r = e.restore_from().unwrap();
        assert_eq!(r.secret, SessionSecret::from_bytes([7; 32]));
        let mode = fs::metadata(e.dir.join(SECRET_FILE)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        put(&store, &key('b'), 4096);
        assert_eq!(store.resolve("aa").unwrap(), key('a'));
        assert!(store.resolve("c").is_err());
        assert!(store.resolve("x!").is_err());
        let (list, bad) = store.list().unwrap();
        assert_eq!(list.len(), 2);
        assert!(bad.is_empty());
        // An incomplete entry is reported, not listed.
        fs::remove_file(store.entry_dir(&key('b')).join(SECRET_FILE)).unwrap();
        let (list, bad) = store.list().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(bad.len(), 1);
        assert!(store.get(&key('b')).is_err());
    }

    #[test]
    fn remove_is_refused_while_in_use_and_lru_eviction_skips_busy_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        for (i, c) in ['a', 'b', 'c'].into_iter().enumerate() {
            put(&store, &key(c), 64 * 1024);
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            let f = OpenOptions::new()
                .append(true)
                .open(store.entry_dir(&key(c)).join(META_FILE))
                .unwrap();
            f.set_modified(t).unwrap();
        }
        // `a` is the least recently used but in use; `c` is kept.
        let busy = store.lock(&key('a'), LockMode::Shared, true).unwrap();
        assert!(matches!(store.remove(&key('a')), Err(StoreError::Busy(_))));
        let evicted = store.evict(0, &key('c'));
        assert_eq!(evicted, vec![key('b')]);
        drop(busy);
        let evicted = store.evict(0, &key('c'));
        assert_eq!(evicted, vec![key('a')]);
        let (list, _) = store.list().unwrap();
        assert_eq!(list.len(), 1);
        // Under the cap nothing goes.
        assert!(store.evict(u64::MAX, "").is_empty());
        store.touch(&key('c'));
        assert!(store.get(&key('c')).unwrap().unwrap().last_used > SystemTime::UNIX_EPOCH);
    }

    /// Installs a diff entry `key` over `base` (`bytes` of diff).
    fn put_diff(store: &Store, key: &str, base: &str, bytes: usize) -> Entry {
        let _x = store.lock(key, LockMode::Exclusive, true).unwrap();
        let st = store.staging().unwrap();
        fs::write(st.path().join("state.snap"), b"s").unwrap();
        fs::write(st.path().join(DIFF_FILE), vec![2u8; bytes]).unwrap();
        let secret = SessionSecret::from_bytes([9; 32]);
        let mut m = meta(key);
        m.base = Some(base.into());
        m.warm = Some(WarmMeta {
            runtime: "claude-code".into(),
            provider: "anthropic".into(),
            model: Some("sonnet".into()),
            kit_hash: "h".into(),
            settle_ms: 5,
            diff_bytes: bytes as u64,
        });
        write_entry_files(st.path(), &secret, &m).unwrap();
        store.install(st, key).unwrap()
    }

    /// Sets `key`'s last use to `secs` after the epoch.
    fn used_at(store: &Store, key: &str, secs: u64) {
        let f = OpenOptions::new()
            .append(true)
            .open(store.entry_dir(key).join(META_FILE))
            .unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn a_diff_restores_over_its_base_and_a_missing_base_is_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        let (a, b) = (key('a'), key('b'));
        let base = put(&store, &a, 4096);
        // A full entry's meta.json is what it was before layers.
        let text = fs::read_to_string(base.dir.join(META_FILE)).unwrap();
        assert!(!text.contains("base") && !text.contains("warm"), "{text}");
        assert_eq!(base.restore_from().unwrap().base, None);
        let diff = put_diff(&store, &b, &a, 4096);
        assert_eq!(diff.meta.kind(), "warm claude-code sonnet");
        assert_eq!(store.get(&b).unwrap().unwrap().meta, diff.meta);
        let r = diff.restore_from().unwrap();
        assert_eq!((r.dir, r.base), (diff.dir.clone(), Some(base.dir.clone())));
        assert_eq!(r.secret, SessionSecret::from_bytes([9; 32]));
        // A base of another VM.
        let mut m = base.meta.clone();
        m.memory_mb = 512;
        fs::write(base.dir.join(META_FILE), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = diff.restore_from().unwrap_err().to_string();
        assert!(e.contains("of another VM (512 MiB"), "{e}");
        // A missing base names both keys and the fix.
        fs::remove_dir_all(&base.dir).unwrap();
        let e = diff.restore_from().unwrap_err();
        assert!(
            matches!(&e, StoreError::BaseMissing { base, .. } if *base == a),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.contains(&format!(
                "diff over the base snapshot {}, which is missing",
                &a[..12]
            )) && e.contains(&format!("`voidbox snapshot rm {}`", &b[..12]))
                && e.contains("recreated"),
            "{e}"
        );
        // A base that is not a key is refused when the entry is read.
        let mut m = diff.meta.clone();
        m.base = Some("../../etc".into());
        fs::write(diff.dir.join(META_FILE), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = Entry::load(&diff.dir).unwrap_err().to_string();
        assert!(e.contains("not another snapshot's key"), "{e}");
    }

    #[test]
    fn a_base_goes_only_with_its_diffs_and_not_while_a_diff_is_in_use() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        let (a, b, c) = (key('a'), key('b'), key('c'));
        put(&store, &a, 4096);
        put_diff(&store, &b, &a, 4096);
        put_diff(&store, &c, &a, 4096);
        assert_eq!(store.dependents(&a), vec![b.clone(), c.clone()]);
        assert!(store.dependents(&b).is_empty());
        let e = store.remove(&a).unwrap_err();
        assert!(
            matches!(&e, StoreError::HasDependents { dependents, .. } if dependents.len() == 2)
        );
        assert!(e.to_string().contains("--with-dependents"), "{e}");
        assert!(store.entry_dir(&a).exists());
        // A VM restoring from a diff holds its base.
        let lease = store.lock(&b, LockMode::Shared, false).unwrap().unwrap();
        assert!(store
            .lock(&a, LockMode::Exclusive, false)
            .unwrap()
            .is_none());
        assert!(matches!(
            store.remove_with_dependents(&a),
            Err(StoreError::Busy(_))
        ));
        assert!(store.entry_dir(&b).exists() && store.entry_dir(&c).exists());
        // ... but not the other diffs.
        store.remove(&c).unwrap();
        drop(lease);
        assert_eq!(
            store.remove_with_dependents(&a).unwrap(),
            vec![b.clone(), a.clone()]
        );
        assert!(!store.entry_dir(&a).exists() && !store.entry_dir(&b).exists());
    }

    #[test]
    fn replacing_a_base_removes_the_diffs_over_its_old_memory() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        let (a, b) = (key('a'), key('b'));
        put(&store, &a, 4096);
        put_diff(&store, &b, &a, 4096);
        put(&store, &a, 4096);
        assert!(store.entry_dir(&a).exists());
        assert!(!store.entry_dir(&b).exists());
    }

    #[test]
    fn eviction_never_leaves_a_diff_without_its_base() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        let (a, b, c, e, f) = (key('a'), key('b'), key('c'), key('e'), key('f'));
        // `a` is the least recently used itself, but its diff `b` is the most recent;
        // `e` is a diff whose base `f` is gone.
        put(&store, &a, 64 * 1024);
        put_diff(&store, &b, &a, 8 * 1024);
        put(&store, &c, 64 * 1024);
        put_diff(&store, &e, &f, 8 * 1024);
        for (k, t) in [(&a, 1000), (&c, 1001), (&b, 1002), (&e, 1003)] {
            used_at(&store, k, t);
        }
        let size = |k: &str| store.get(k).unwrap().unwrap().disk_bytes;
        let total: u64 = [&a, &b, &c, &e].iter().map(|k| size(k)).sum();
        // The orphan first, then the least recently used group: `c`, not `a`.
        let evicted = store.evict(total - size(&e) - size(&c), "");
        assert_eq!(evicted, vec![e.clone(), c.clone()]);
        // A diff in use holds its base; a kept diff keeps its base.
        let lease = store.lock(&b, LockMode::Shared, true).unwrap();
        assert!(store.evict(0, "").is_empty());
        drop(lease);
        assert!(store.evict(0, &b).is_empty());
        // The diff goes first, then its base.
        assert_eq!(store.evict(0, ""), vec![b.clone(), a.clone()]);
        assert!(store.list().unwrap().0.is_empty());
        // With one last use for both, the diff still goes before its base.
        put(&store, &a, 64 * 1024);
        put_diff(&store, &b, &a, 8 * 1024);
        used_at(&store, &b, 1000);
        used_at(&store, &a, 1000);
        assert_eq!(store.evict(0, ""), vec![b, a]);
        assert!(store.list().unwrap().0.is_empty());
    }
}
