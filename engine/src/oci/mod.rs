//! OCI images as the engine uses them: blocking pulls for `apply`/`run` (`sandbox.image`,
//! `sandbox.guest_image`, OCI skills), the cache's size cap, and `voidbox pull` /
//! `voidbox oci ls|rm|prune` ([`cli`]).
//!
//! The client itself is the `voidbox-oci` crate; this module adds what is engine policy:
//! - **Where the cache lives**: [`store`] (`$XDG_CACHE_HOME/voidbox/oci`), or a directory given
//!   with `--cache-dir` ([`open_store`]).
//! - **Plain HTTP**: loopback registries always; others only when listed in
//!   [`INSECURE_REGISTRIES_ENV`] (comma-separated `host[:port]`) or with
//!   `--insecure-registry` ([`pull_options`], [`pull_options_with`]).
//! - **The LRU cap**: [`MAX_BYTES_ENV`] (`20G` by default, `K`/`M`/`G` suffixes like the
//!   snapshot cap). Every pull that added an image prunes the cache down to the cap, least
//!   recently used first, never evicting the image just pulled ([`prune_keeping`]).
//! - **Progress** on stderr ([`progress`]).
//!
//! Every failure is an [`OciError`]; callers map them all to exit code 3. Registry
//! credentials (`VOIDBOX_REGISTRY_USERNAME`/`VOIDBOX_REGISTRY_PASSWORD`, Docker's
//! `config.json`) are never printed: the crate scrubs them from every error.

pub mod cli;
pub mod progress;

use std::future::Future;
use std::path::Path;

pub use progress::PullReporter;
use voidbox_oci::{BootFiles, CachedImage, Digest, ImageRef, Platform};
pub use voidbox_oci::{OciError, PullOptions, PulledImage, Store};

use crate::output::ProgressMode;
use crate::units::human_size;

/// Environment variable capping the OCI cache, in bytes (`K`, `M`, `G` suffixes).
pub const MAX_BYTES_ENV: &str = "VOIDBOX_OCI_MAX_BYTES";
/// The cap when [`MAX_BYTES_ENV`] is unset: 20 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 20 << 30;
/// Environment variable listing registries (`host[:port]`, comma-separated) that may be
/// reached over plain HTTP although they are not on loopback.
pub const INSECURE_REGISTRIES_ENV: &str = "VOIDBOX_INSECURE_REGISTRIES";

/// The cache size cap: [`MAX_BYTES_ENV`] or [`DEFAULT_MAX_BYTES`]; the error names the
/// variable and what is wrong with its value.
pub fn max_bytes() -> Result<u64, String> {
    match std::env::var(MAX_BYTES_ENV) {
        Ok(v) => crate::units::parse_size(&v).map_err(|e| format!("{MAX_BYTES_ENV}: {e}")),
        Err(_) => Ok(DEFAULT_MAX_BYTES),
    }
}

/// The OCI cache at its default place (`$XDG_CACHE_HOME/voidbox/oci`, else
/// `~/.cache/voidbox/oci`), created if needed.
pub fn store() -> Result<Store, OciError> {
    open_store(None)
}

/// The OCI cache at `cache_dir` (a `--cache-dir` argument), else at the default place.
pub fn open_store(cache_dir: Option<&Path>) -> Result<Store, OciError> {
    match cache_dir {
        Some(dir) => Store::open(dir),
        None => Store::open_default(),
    }
}

/// Pull options for `apply`/`run`: `linux/amd64`, plain HTTP for the registries listed in
/// [`INSECURE_REGISTRIES_ENV`].
pub fn pull_options() -> PullOptions {
    pull_options_with(&[], Platform::default())
}

/// Pull options for `platform`, with plain HTTP for the registries in `insecure` (e.g.
/// `--insecure-registry` arguments) and those in [`INSECURE_REGISTRIES_ENV`].
pub fn pull_options_with(insecure: &[String], platform: Platform) -> PullOptions {
    let env = std::env::var(INSECURE_REGISTRIES_ENV).unwrap_or_default();
    PullOptions {
        insecure_registries: merge_insecure(insecure, &env),
        platform,
    }
}

/// `flags` then the comma-separated entries of `env`, trimmed, without empties and without
/// case-insensitive duplicates.
fn merge_insecure(flags: &[String], env: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for entry in flags.iter().map(String::as_str).chain(env.split(',')) {
        let entry = entry.trim();
        if !entry.is_empty() && !out.iter().any(|e| e.eq_ignore_ascii_case(entry)) {
            out.push(entry.to_string());
        }
    }
    out
}

/// Checks an `--insecure-registry` value: `host` or `host:port`, without a scheme or path.
pub fn parse_registry_host(s: &str) -> Result<String, String> {
    let s = s.trim();
    let ok = !s.is_empty()
        && !s.contains("://")
        && !s.contains('/')
        && !s.chars().any(|c| c.is_whitespace() || c == ',' || c == '@');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a registry `host` or `host:port` (no scheme, no path)"
        ))
    }
}

/// Pulls `reference` into the default cache ([`store`]) and returns its erofs disk, then
/// prunes the cache to [`max_bytes`] when the pull added an image (never evicting it).
///
/// Progress goes to stderr as `progress` says ([`PullReporter`]); evictions are noted there
/// too (except in [`ProgressMode::Quiet`]). `opts` usually comes from [`pull_options`].
///
/// Blocking: on a thread without a tokio runtime the pull runs on a small current-thread
/// runtime built for it; called from inside a runtime (e.g. an `async` task), it runs on a
/// separate thread with its own runtime and this thread waits for it — so it never panics,
/// but it does block the calling thread for the length of the pull.
pub fn pull_blocking(
    reference: &str,
    opts: &PullOptions,
    progress: ProgressMode,
) -> Result<PulledImage, OciError> {
    let store = store()?;
    pull_into(&store, reference, opts, progress).map(|p| p.image)
}

/// Pulls the void-box guest image `reference` into the default cache (as [`pull_blocking`],
/// cap included) and returns its kernel and initramfs; an image without a kernel is
/// [`OciError::NoKernel`].
pub fn pull_boot_files_blocking(
    reference: &str,
    opts: &PullOptions,
    progress: ProgressMode,
) -> Result<BootFiles, OciError> {
    let store = store()?;
    let pulled = pull_into(&store, reference, opts, progress)?.image;
    // The pull above resolved the tag; read the files of exactly that image from the cache
    // (a pinned-digest reference is served without the network).
    let image = ImageRef::parse(reference)?;
    let pinned = format!(
        "{}/{}@{}",
        image.registry(),
        image.repository(),
        pulled.manifest_digest
    );
    block_on(store.pull_boot_files(&pinned, opts, &voidbox_oci::NoProgress))
        .and_then(|r| r)
        .map_err(|e| match e {
            OciError::NoKernel { looked_at, .. } => OciError::NoKernel {
                reference: reference.to_string(),
                looked_at,
            },
            e => e,
        })
}

/// What [`pull_into`] did.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The image.
    pub image: PulledImage,
    /// Images evicted afterwards to keep the cache under its cap.
    pub evicted: Vec<CachedImage>,
    /// The cap that applied.
    pub max_bytes: u64,
    /// How long the pull took.
    pub elapsed: std::time::Duration,
}

/// Pulls `reference` into `store` with progress on stderr, then (when the pull added an
/// image) prunes `store` to [`max_bytes`] keeping the image just pulled. A prune failure is
/// a warning on stderr: the pull itself succeeded. An invalid [`MAX_BYTES_ENV`] fails before
/// anything is downloaded.
pub fn pull_into(
    store: &Store,
    reference: &str,
    opts: &PullOptions,
    progress: ProgressMode,
) -> Result<Pulled, OciError> {
    let cap = max_bytes().map_err(|reason| OciError::Cache {
        path: store.root().to_path_buf(),
        reason,
    })?;
    let started = std::time::Instant::now();
    let reporter = PullReporter::new(progress, reference);
    let image = block_on(store.pull(reference, opts, &reporter)).and_then(|r| r);
    reporter.finish();
    let image = image?;
    let elapsed = started.elapsed();
    let mut evicted = Vec::new();
    if !image.cache_hit {
        match prune_keeping(store, cap, Some(&image.manifest_digest)) {
            Ok(gone) => evicted = gone,
            Err(e) => eprintln!("warning: pruning the OCI cache: {e}"),
        }
        if progress != ProgressMode::Quiet {
            for gone in &evicted {
                eprintln!(
                    "evicted {} {} (OCI cache over {}, {MAX_BYTES_ENV})",
                    short_digest(&gone.manifest_digest),
                    gone.references.first().map_or("", String::as_str),
                    human_size(cap)
                );
            }
        }
    }
    Ok(Pulled {
        image,
        evicted,
        max_bytes: cap,
        elapsed,
    })
}

/// [`Store::prune`] to `max_bytes`, least recently used first, never evicting `keep` (a
/// manifest digest): its lock is held meanwhile, and `prune` passes over locked images.
pub fn prune_keeping(
    store: &Store,
    max_bytes: u64,
    keep: Option<&str>,
) -> Result<Vec<CachedImage>, OciError> {
    let _guard = match keep {
        Some(d) => Some(KeepLock::take(store, d)?),
        None => None,
    };
    store.prune(max_bytes)
}

/// An exclusive `flock` on an image's lock file (`locks/<hex>.lock`, the cache layout the
/// `voidbox-oci` store documents); released on drop.
struct KeepLock(#[allow(dead_code)] std::fs::File);

impl KeepLock {
    fn take(store: &Store, digest: &str) -> Result<KeepLock, OciError> {
        let d = Digest::parse(digest).map_err(|reason| OciError::Cache {
            path: store.root().to_path_buf(),
            reason,
        })?;
        let path = store.root().join("locks").join(format!("{}.lock", d.hex()));
        let io = |e: std::io::Error| OciError::Io {
            context: format!("locking {}", path.display()),
            source: e,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(e.into()))?;
        Ok(KeepLock(file))
    }
}

/// `sha256:0123456789ab` (12 hex digits).
pub fn short_digest(digest: &str) -> &str {
    let end = "sha256:".len() + 12;
    digest.get(..end).unwrap_or(digest)
}

/// Runs `fut` to completion from synchronous code: on a fresh current-thread runtime, or —
/// when this thread already runs inside a tokio runtime, where blocking on it would panic —
/// on a scoped thread with its own runtime.
pub fn block_on<F>(fut: F) -> Result<F::Output, OciError>
where
    F: Future + Send,
    F::Output: Send,
{
    fn run<F: Future>(fut: F) -> Result<F::Output, OciError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| OciError::Io {
                context: "starting the pull's runtime".into(),
                source: e,
            })?;
        Ok(rt.block_on(fut))
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return run(fut);
    }
    std::thread::scope(|s| {
        s.spawn(|| run(fut)).join().unwrap_or_else(|_| {
            Err(OciError::Io {
                context: "pulling".into(),
                source: std::io::Error::other("the pull's thread panicked"),
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_registries_merge_flags_and_environment() {
        let merged = merge_insecure(
            &["lab.local".into()],
            " reg.example:5000 ,, 10.0.0.7 ,REG.example:5000,LAB.local",
        );
        assert_eq!(merged, ["lab.local", "reg.example:5000", "10.0.0.7"]);
        assert!(voidbox_oci::plain_http_allowed("10.0.0.7:443", &merged));
        assert!(!voidbox_oci::plain_http_allowed(
            "reg.example:5001",
            &merged
        ));
        assert!(merge_insecure(&[], "").is_empty());
    }

    #[test]
    fn registry_hosts_are_host_and_port_only() {
        assert_eq!(parse_registry_host(" reg:5000 ").unwrap(), "reg:5000");
        assert_eq!(parse_registry_host("[::1]:5000").unwrap(), "[::1]:5000");
        for bad in ["", "http://reg", "reg/path", "a b", "a,b", "user@reg"] {
            assert!(parse_registry_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn short_digests() {
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(short_digest(&d), "sha256:abababababab");
        assert_eq!(short_digest("x"), "x");
    }

    #[test]
    fn block_on_works_inside_and_outside_a_runtime() {
        assert_eq!(block_on(async { 7 }).unwrap(), 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let inner = rt.block_on(async { block_on(async { 8 }).unwrap() });
        assert_eq!(inner, 8);
    }
}
