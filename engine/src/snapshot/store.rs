//! The golden snapshot cache.
//!
//! ```text
//! $XDG_CACHE_HOME/voidbox/snapshots/        (fallback ~/.cache/voidbox/snapshots)
//!   <key>/            state.snap + memory.bin (written by the VMM), secret, meta.json
//!   locks/<key>.lock  flock(2): shared while a VM restores from the entry, exclusive
//!                     while it is created or removed
//!   tmp/              staging dirs (same filesystem, so entries appear by rename)
//! ```
//!
//! An entry's last use is the mtime of its `meta.json`; the cache is kept under a size cap
//! by evicting the least recently used entries that no VM is restoring from.

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
/// Largest `meta.json` read.
const MAX_META_BYTES: u64 = 64 * 1024;

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
        for f in [
            voidbox_vmm::persist::format::STATE_FILE,
            voidbox_vmm::persist::format::MEMORY_FILE,
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

    /// What a VM needs to restore from this entry (reads the secret).
    pub fn restore_from(&self) -> Result<RestoreFrom, StoreError> {
        let path = self.dir.join(SECRET_FILE);
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        let secret = SessionSecret::from_hex(&text).map_err(|e| StoreError::Invalid {
            dir: self.dir.clone(),
            why: format!("{SECRET_FILE}: {e}"),
        })?;
        Ok(RestoreFrom {
            dir: self.dir.clone(),
            secret,
            base: None,
        })
    }
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

/// A held entry lock, released when dropped.
#[derive(Debug)]
pub struct EntryLock {
    _file: File,
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
    /// conflicting mode.
    pub fn lock(
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
            .then_some(EntryLock { _file: file }))
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

    /// Moves a finished staging directory into place as `key` (replacing a stale entry).
    /// Call with the exclusive lock of `key` held.
    pub fn install(&self, staging: tempfile::TempDir, key: &str) -> Result<Entry, StoreError> {
        let dest = self.entry_dir(key);
        let tmp = self.private_dir("tmp")?;
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

    /// Removes one entry; refused while a VM restores from it.
    pub fn remove(&self, key: &str) -> Result<(), StoreError> {
        let Some(_lock) = self.lock(key, LockMode::Exclusive, false)? else {
            return Err(StoreError::Busy(key.to_string()));
        };
        let tmp = self.private_dir("tmp")?;
        remove_dir_atomically(&self.entry_dir(key), &tmp)
            .map_err(|e| StoreError::Environment(e.to_string()))
    }

    /// Evicts least recently used entries (never `keep`, never one in use) until the cache
    /// uses at most `max_bytes`. Returns the evicted keys.
    pub fn evict(&self, max_bytes: u64, keep: &str) -> Vec<String> {
        let Ok((entries, _)) = self.list() else {
            return Vec::new();
        };
        let mut total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
        let mut evicted = Vec::new();
        for e in entries.iter().rev() {
            if total <= max_bytes {
                break;
            }
            if e.meta.key == keep {
                continue;
            }
            if self.remove(&e.meta.key).is_ok() {
                total = total.saturating_sub(e.disk_bytes);
                evicted.push(e.meta.key.clone());
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
}
