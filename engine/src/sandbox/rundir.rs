//! A run's temporary directory (`voidbox-apply-*`, `voidbox-run-*` in the temp dir), and
//! the sweep of those whose run died without removing them (SIGKILL, a crash, a power cut).
//!
//! Each directory holds `owner` (the pid that made it, for messages only) and `lock`, on
//! which its run holds an exclusive `flock(2)` for its whole life. The kernel drops that lock
//! when the run dies, however it dies; the lock, not the pid (which the system may reuse), is
//! what says a directory is dead. [`sweep`] removes a directory only while holding its lock,
//! so no live run is ever touched.

use std::fs::File;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

use crate::image::cache::{open_lock_file, try_flock};

/// Name prefixes of the run directories [`sweep`] looks at.
pub const PREFIXES: [&str; 2] = ["voidbox-apply-", "voidbox-run-"];
/// The lock file inside a run directory.
const LOCK_FILE: &str = "lock";
/// The owner file inside a run directory (its run's pid).
const OWNER_FILE: &str = "owner";

/// A live run's temporary directory, locked until dropped (then removed).
#[derive(Debug)]
pub struct RunDir {
    // Field order is drop order: the directory goes while its lock is still held.
    dir: tempfile::TempDir,
    _lock: File,
}

impl RunDir {
    /// Makes a fresh `PREFIX*` directory in the temp dir, locked and with its owner recorded.
    pub fn create(prefix: &str) -> std::io::Result<RunDir> {
        RunDir::create_in(prefix, &std::env::temp_dir())
    }

    /// [`RunDir::create`] in `parent`.
    pub fn create_in(prefix: &str, parent: &Path) -> std::io::Result<RunDir> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
        let lock = open_lock_file(&dir.path().join(LOCK_FILE), 0o600)?;
        if !try_flock(&lock, FlockOperation::NonBlockingLockExclusive)? {
            return Err(std::io::Error::other(
                "a fresh run directory's lock is held by someone else",
            ));
        }
        std::fs::write(
            dir.path().join(OWNER_FILE),
            format!("{}\n", std::process::id()),
        )?;
        Ok(RunDir { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A dead run's directory that [`sweep`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// The directory.
    pub path: PathBuf,
    /// The pid that made it, as it recorded it.
    pub owner: Option<u32>,
    /// It was removed (else why not).
    pub removed: Result<(), String>,
}

/// Removes every dead run directory in the temp dir (see [`sweep_in`]).
pub fn sweep() -> Vec<Stale> {
    sweep_in(&std::env::temp_dir())
}

/// Removes the run directories in `parent` whose lock nobody holds (their run is gone),
/// taking each lock first. Directories of live runs, of other users, and without a lock
/// file are left alone.
pub fn sweep_in(parent: &Path) -> Vec<Stale> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let uid = rustix::process::getuid().as_raw();
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let path = e.path();
        // Not following links: only real directories of this user.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != uid {
            continue;
        }
        // No lock file: just being made (or not ours to judge).
        let Ok(lock) = std::fs::OpenOptions::new()
            .write(true)
            .open(path.join(LOCK_FILE))
        else {
            continue;
        };
        // Held: a live run's. The lock, not the recorded pid (which may be reused), decides.
        if !matches!(
            try_flock(&lock, FlockOperation::NonBlockingLockExclusive),
            Ok(true)
        ) {
            continue;
        }
        let owner = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let removed = std::fs::remove_dir_all(&path).map_err(|e| e.to_string());
        drop(lock);
        out.push(Stale {
            path,
            owner,
            removed,
        });
    }
    out
}

/// One line per swept directory, for a run's stderr.
pub fn describe(s: &Stale) -> String {
    let owner = s
        .owner
        .map_or_else(|| "a run".to_string(), |p| format!("run {p}"));
    match &s.removed {
        Ok(()) => format!("removed {}, left by {owner} that is gone", s.path.display()),
        Err(e) => format!(
            "cannot remove {}, left by {owner} that is gone: {e}",
            s.path.display()
        ),
    }
}

/// Sweeps at the start of a run, telling stderr what was removed.
pub fn sweep_at_start() {
    for s in sweep() {
        eprintln!("voidbox: {}", describe(&s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_only_dead_runs() {
        let parent = tempfile::tempdir().unwrap();
        let live = RunDir::create_in("voidbox-apply-", parent.path()).unwrap();
        // A dead run: its directory and files stay, its lock is gone with it.
        let dead = RunDir::create_in("voidbox-run-", parent.path()).unwrap();
        let dead_path = dead.path().to_path_buf();
        let kept = dead.dir.keep();
        drop(dead._lock);
        assert_eq!(kept, dead_path);
        std::fs::create_dir(dead_path.join("voidbox-vm-x")).unwrap();
        // Not a run directory, and one without a lock: both left alone.
        let other = parent.path().join("voidbox-other-1");
        std::fs::create_dir(&other).unwrap();
        let unlocked = parent.path().join("voidbox-apply-nolock");
        std::fs::create_dir(&unlocked).unwrap();
        let swept = sweep_in(parent.path());
        assert_eq!(swept.len(), 1, "{swept:?}");
        assert_eq!(swept[0].path, dead_path);
        assert_eq!(swept[0].owner, Some(std::process::id()));
        assert_eq!(swept[0].removed, Ok(()));
        assert!(!dead_path.exists());
        assert!(
            live.path().join(LOCK_FILE).exists(),
            "a live run is untouched"
        );
        assert!(other.exists() && unlocked.exists());
        assert!(describe(&swept[0]).contains("that is gone"));
        // Dropped: removed.
        let p = live.path().to_path_buf();
        drop(live);
        assert!(!p.exists());
    }
}
