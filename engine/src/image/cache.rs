//! The image cache.
//!
//! ```text
//! $XDG_CACHE_HOME/voidbox/            (fallback ~/.cache/voidbox)
//!   images/<image-hash>/              vmlinux, system.erofs, voidbox-agent, config,
//!                                     manifest.json (old layout: initramfs.cpio instead
//!                                     of the disk and agent)
//!   kernels/<kernel-hash>/            vmlinux, config, build.log (reused across images
//!                                     that differ only in the system disk)
//!   locks/<hash>.lock                 flock(2) held while building or removing
//!   tmp/                              build trees and staging dirs (same filesystem,
//!                                     so finished entries are renamed into place)
//! ```

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::error::ImageError;
use super::manifest::{Manifest, MANIFEST_FILE};

/// The cache root and its layout.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// A cached image.
#[derive(Debug, Clone)]
pub struct CachedImage {
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Readable images, and image directories that could not be read (with why).
pub type Listing = (Vec<CachedImage>, Vec<(PathBuf, ImageError)>);

/// An exclusive `flock(2)` on one cache key, released when dropped (the file closes).
#[derive(Debug)]
pub struct KeyLock {
    _file: File,
}

impl Cache {
    /// The default location: `$XDG_CACHE_HOME/voidbox`, else `$HOME/.cache/voidbox`.
    pub fn default_root() -> Result<PathBuf, ImageError> {
        let abs = |v: std::ffi::OsString| {
            let p = PathBuf::from(v);
            p.is_absolute().then_some(p)
        };
        if let Some(p) = std::env::var_os("XDG_CACHE_HOME").and_then(abs) {
            return Ok(p.join("voidbox"));
        }
        std::env::var_os("HOME")
            .and_then(abs)
            .map(|h| h.join(".cache").join("voidbox"))
            .ok_or_else(|| ImageError::Environment("neither XDG_CACHE_HOME nor HOME is set".into()))
    }

    /// A cache rooted at `root` (created on demand).
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// The cache at `root`, or at [`Cache::default_root`].
    pub fn open(root: Option<&Path>) -> Result<Cache, ImageError> {
        Ok(match root {
            Some(r) => Cache::new(r),
            None => Cache::new(Cache::default_root()?),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `images/`.
    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    /// `images/<hash>/`.
    pub fn image_dir(&self, hash: &str) -> PathBuf {
        self.images_dir().join(hash)
    }

    /// `kernels/<hash>/`.
    pub fn kernel_dir(&self, hash: &str) -> PathBuf {
        self.root.join("kernels").join(hash)
    }

    /// `tmp/`, created.
    pub fn tmp_dir(&self) -> Result<PathBuf, ImageError> {
        let p = self.root.join("tmp");
        fs::create_dir_all(&p).map_err(ImageError::io(&p))?;
        Ok(p)
    }

    /// Takes the exclusive lock for `key`, calling `waiting` once if another process
    /// holds it.
    pub fn lock(&self, key: &str, waiting: &mut dyn FnMut()) -> Result<KeyLock, ImageError> {
        use rustix::fs::FlockOperation;
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir).map_err(ImageError::io(&dir))?;
        let path = dir.join(format!("{key}.lock"));
        let file = open_lock_file(&path, 0o666).map_err(ImageError::io(&path))?;
        if !try_flock(&file, FlockOperation::NonBlockingLockExclusive)
            .map_err(ImageError::io(&path))?
        {
            waiting();
            try_flock(&file, FlockOperation::LockExclusive).map_err(ImageError::io(&path))?;
        }
        Ok(KeyLock { _file: file })
    }

    /// Every image with a readable manifest, newest first; unreadable ones are
    /// returned separately as (dir, error).
    pub fn list(&self) -> Result<Listing, ImageError> {
        let dir = self.images_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
            Err(e) => return Err(ImageError::io(&dir)(e)),
        };
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for entry in rd.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !is_hash(name) || !path.is_dir() {
                continue;
            }
            match Manifest::load(&path) {
                Ok(m) if m.hash == name => good.push(CachedImage {
                    dir: path,
                    manifest: m,
                }),
                Ok(_) => bad.push((
                    path.clone(),
                    ImageError::Manifest {
                        path: path.join(MANIFEST_FILE),
                        what: "hash differs from the directory name".into(),
                    },
                )),
                Err(e) => bad.push((path, e)),
            }
        }
        good.sort_by(|a, b| {
            b.manifest
                .created_unix
                .cmp(&a.manifest.created_unix)
                .then_with(|| a.manifest.hash.cmp(&b.manifest.hash))
        });
        Ok((good, bad))
    }

    /// Image directory names starting with `prefix` (any directory named like a hash,
    /// manifest or not).
    pub fn find(&self, prefix: &str) -> Result<Vec<String>, ImageError> {
        let dir = self.images_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(ImageError::io(&dir)(e)),
        };
        let mut v: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_hash(n) && n.starts_with(prefix))
            .collect();
        v.sort();
        Ok(v)
    }

    /// Resolves a unique hash prefix.
    pub fn resolve(&self, prefix: &str) -> Result<String, ImageError> {
        const IMAGES: PrefixOf = PrefixOf {
            key: "hash",
            noun: "image",
            hint: "",
        };
        let prefix = IMAGES.check(prefix).map_err(ImageError::NoMatch)?;
        IMAGES
            .unique(&prefix, self.find(&prefix)?)
            .map_err(ImageError::NoMatch)
    }

    /// Removes one image (under its lock), then kernels no image refers to.
    pub fn remove(&self, hash: &str) -> Result<(), ImageError> {
        let _lock = self.lock(hash, &mut || {})?;
        remove_dir_atomically(&self.image_dir(hash), &self.tmp_dir()?)?;
        self.prune_kernels()
    }

    /// Removes every image and kernel, and stale temporary files.
    pub fn remove_all(&self) -> Result<usize, ImageError> {
        let mut n = 0;
        for hash in self.find("")? {
            let _lock = self.lock(&hash, &mut || {})?;
            remove_dir_atomically(&self.image_dir(&hash), &self.tmp_dir()?)?;
            n += 1;
        }
        self.prune_kernels()?;
        Ok(n)
    }

    /// Deletes cached kernels not referenced by any image.
    pub fn prune_kernels(&self) -> Result<(), ImageError> {
        let (images, _) = self.list()?;
        let used: Vec<&str> = images
            .iter()
            .map(|i| i.manifest.kernel.inputs_hash.as_str())
            .collect();
        let kdir = self.root.join("kernels");
        let Ok(rd) = fs::read_dir(&kdir) else {
            return Ok(());
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if is_hash(name) && !used.contains(&name) {
                let Ok(_lock) = self.lock(&format!("kernel-{name}"), &mut || {}) else {
                    continue;
                };
                remove_dir_atomically(&e.path(), &self.tmp_dir()?)?;
            }
        }
        Ok(())
    }

    /// Moves a finished staging directory to `dest` (same filesystem). If `dest`
    /// already exists (built meanwhile by someone else), the staging dir is discarded.
    pub fn install(&self, staging: &Path, dest: &Path) -> Result<(), ImageError> {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(ImageError::io(parent))?;
        }
        if dest.exists() {
            return remove_dir_atomically(staging, &self.tmp_dir()?);
        }
        fs::rename(staging, dest).map_err(ImageError::io(dest))
    }
}

/// Opens (creating with `mode`) a lock file for [`try_flock`].
pub fn open_lock_file(path: &Path, mode: u32) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(mode)
        .open(path)
}

/// `flock(2)` with `op`: `Ok(false)` when a non-blocking `op` finds the lock held in a
/// conflicting mode.
pub fn try_flock(file: &File, op: rustix::fs::FlockOperation) -> std::io::Result<bool> {
    match rustix::fs::flock(file, op) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What a cache key prefix given on the command line names, for the messages of
/// [`PrefixOf::check`] and [`PrefixOf::unique`].
#[derive(Debug, Clone, Copy)]
pub struct PrefixOf {
    /// What the prefix is a prefix of (`hash`, `snapshot key`).
    pub key: &'static str,
    /// What the cache holds (`image`, `snapshot`).
    pub noun: &'static str,
    /// Appended to the "nothing matches" message.
    pub hint: &'static str,
}

impl PrefixOf {
    /// The prefix in lower case, or why it cannot be one (empty, not hexadecimal).
    pub fn check(&self, prefix: &str) -> Result<String, String> {
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{prefix:?} is not a {} prefix", self.key));
        }
        Ok(prefix.to_ascii_lowercase())
    }

    /// The one key in `found` (the keys starting with `prefix`), or why there is not one.
    pub fn unique(&self, prefix: &str, mut found: Vec<String>) -> Result<String, String> {
        match found.len() {
            0 => Err(format!(
                "no cached {} matches {prefix}{}",
                self.noun, self.hint
            )),
            1 => Ok(found.remove(0)),
            n => Err(format!(
                "{prefix} is ambiguous ({n} {}s match); use a longer prefix",
                self.noun
            )),
        }
    }
}

/// Whether `s` looks like one of our hashes (64 lowercase hex digits).
pub fn is_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Renames `dir` into `tmp` and deletes it there, so readers never see half a dir.
pub fn remove_dir_atomically(dir: &Path, tmp: &Path) -> Result<(), ImageError> {
    if !dir.exists() {
        return Ok(());
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let trash = tmp.join(format!("trash-{}-{nanos}", std::process::id()));
    fs::rename(dir, &trash).map_err(ImageError::io(dir))?;
    fs::remove_dir_all(&trash).map_err(ImageError::io(&trash))
}

#[cfg(test)]
mod tests {
    use super::super::manifest::tests::manifest;
    use super::*;

    fn put(cache: &Cache, created: u64, agent: &[u8]) -> String {
        let mut m = manifest();
        m.inputs.guest_agent_sha256 = super::super::manifest::sha256_hex(agent);
        m.guest_agent_sha256 = m.inputs.guest_agent_sha256.clone();
        m.hash = super::super::manifest::content_hash(&m.inputs);
        m.created_unix = created;
        let dir = cache.image_dir(&m.hash);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(MANIFEST_FILE), m.to_json()).unwrap();
        m.hash
    }

    #[test]
    fn list_resolve_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        assert!(cache.list().unwrap().0.is_empty());
        let a = put(&cache, 10, b"a");
        let b = put(&cache, 20, b"b");
        // Junk is ignored or reported, never fatal.
        fs::create_dir_all(cache.images_dir().join("not-a-hash")).unwrap();
        let broken = "f".repeat(64);
        fs::create_dir_all(cache.image_dir(&broken)).unwrap();
        fs::write(cache.image_dir(&broken).join(MANIFEST_FILE), "{").unwrap();

        let (good, bad) = cache.list().unwrap();
        assert_eq!(
            good.iter()
                .map(|i| i.manifest.hash.clone())
                .collect::<Vec<_>>(),
            [b.clone(), a.clone()]
        );
        assert_eq!(bad.len(), 1);

        assert_eq!(cache.resolve(&a[..12]).unwrap(), a);
        assert!(matches!(cache.resolve("zz"), Err(ImageError::NoMatch(_))));

        // A kernel referenced by the images survives pruning; an orphan does not.
        let used = good[0].manifest.kernel.inputs_hash.clone();
        fs::create_dir_all(cache.kernel_dir(&used)).unwrap();
        let orphan = "e".repeat(64);
        fs::create_dir_all(cache.kernel_dir(&orphan)).unwrap();

        cache.remove(&a).unwrap();
        assert!(!cache.image_dir(&a).exists());
        assert!(cache.image_dir(&b).exists());
        assert!(cache.kernel_dir(&used).exists());
        assert!(!cache.kernel_dir(&orphan).exists());

        assert_eq!(cache.remove_all().unwrap(), 2); // b and the broken one
        assert!(cache.list().unwrap().0.is_empty());
        assert!(!cache.kernel_dir(&used).exists());
    }

    #[test]
    fn ambiguous_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        for h in ["ab".repeat(32), format!("ab{}", "0".repeat(62))] {
            fs::create_dir_all(cache.image_dir(&h)).unwrap();
        }
        assert!(cache
            .resolve("ab")
            .unwrap_err()
            .to_string()
            .contains("ambiguous"));
        assert_eq!(cache.resolve("abab").unwrap(), "ab".repeat(32));
    }

    #[test]
    fn lock_excludes_and_install_is_atomic() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let held = cache.lock("k", &mut || panic!("not contended")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let c2 = cache.clone();
        let t = std::thread::spawn(move || {
            let mut waited = false;
            let _l = c2.lock("k", &mut || waited = true).unwrap();
            tx.send(waited).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "second lock must wait");
        drop(held);
        assert!(rx.recv().unwrap(), "waiting callback must run");
        t.join().unwrap();

        let staging = cache.tmp_dir().unwrap().join("stage");
        fs::create_dir_all(&staging).unwrap();
        fs::write(staging.join("f"), "1").unwrap();
        let dest = cache.image_dir(&"a".repeat(64));
        cache.install(&staging, &dest).unwrap();
        assert_eq!(fs::read_to_string(dest.join("f")).unwrap(), "1");
        // A second install of the same key keeps the first.
        fs::create_dir_all(&staging).unwrap();
        fs::write(staging.join("f"), "2").unwrap();
        cache.install(&staging, &dest).unwrap();
        assert_eq!(fs::read_to_string(dest.join("f")).unwrap(), "1");
        assert!(!staging.exists());
    }

    #[test]
    fn default_root_honours_xdg() {
        // Only checks the shape; the environment is process-global.
        let root = Cache::default_root().unwrap();
        assert!(root.ends_with("voidbox"));
    }
}
