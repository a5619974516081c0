//! `voidbox runtimes build|ls|verify`, and the pieces `voidbox image build|ls|verify` use
//! to ensure, list and verify the runtimes disk alongside the guest image.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

use super::{RuntimesDisk, RuntimesError};
use crate::image::Cache;
use crate::output::Format;
use crate::units::{human_age, human_size};

/// `voidbox runtimes` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RuntimesCommand {
    /// Fetch the pinned agent runtimes (Claude Code, Codex) from the npm registry and build
    /// their read-only disk into the cache (`voidbox image build` does this too).
    Build {
        /// Cache root (default: $XDG_CACHE_HOME/voidbox or ~/.cache/voidbox).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Print the result as JSON on stdout.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// List cached runtimes disks with the versions they carry.
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Remove a cached runtimes disk (by its key or a unique prefix of it).
    Rm {
        /// The disk's key, or a unique prefix (as `ls` shows it).
        key: String,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Re-hash cached runtimes disks and check every file on them against their manifests
    /// (disks of an older layout are listed as stale, not checked).
    Verify {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Cache root.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
}

/// Runs a `voidbox runtimes` subcommand.
pub fn run_cli(cmd: RuntimesCommand) -> ExitCode {
    match run(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cmd: RuntimesCommand) -> Result<ExitCode, RuntimesError> {
    match cmd {
        RuntimesCommand::Build { cache_dir, format } => {
            let d = ensure_logged(cache_dir.as_deref())?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&disk_json(&d)).unwrap_or_default()
                ),
                Format::Human => println!("{}", d.path.display()),
            }
            Ok(ExitCode::SUCCESS)
        }
        RuntimesCommand::Ls { format, cache_dir } => {
            let (disks, broken) = super::list(cache_dir.as_deref())?;
            match format {
                Format::Json => {
                    let v: Vec<Value> = disks.iter().map(disk_json).collect();
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                }
                Format::Human if disks.is_empty() => eprintln!(
                    "no cached runtimes disk in {} (run `voidbox runtimes build`)",
                    runtimes_dir(cache_dir.as_deref())?.display()
                ),
                Format::Human => print_table(&disks),
            }
            for (dir, e) in &broken {
                eprintln!("warning: {}: {e}", dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        RuntimesCommand::Rm { key, cache_dir } => {
            let removed = remove(cache_dir.as_deref(), &key)?;
            println!("removed runtimes disk {}", short_key(&removed));
            Ok(ExitCode::SUCCESS)
        }
        RuntimesCommand::Verify { format, cache_dir } => {
            let (disks, broken) = super::list(cache_dir.as_deref())?;
            if disks.is_empty() && broken.is_empty() {
                return Err(RuntimesError::NotFound(format!(
                    "no cached runtimes disk in {} (run `voidbox runtimes build`)",
                    runtimes_dir(cache_dir.as_deref())?.display()
                )));
            }
            let (failed, out) = verify_all(cache_dir.as_deref(), format)?;
            if format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            }
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Removes the cached disk whose key is `key` or starts with it (one match only); returns
/// its key.
pub fn remove(cache_root: Option<&Path>, key: &str) -> Result<String, RuntimesError> {
    const DISKS: crate::image::cache::PrefixOf = crate::image::cache::PrefixOf {
        key: "runtimes key",
        noun: "runtimes disk",
        hint: " (see `voidbox runtimes ls`)",
    };
    let prefix = DISKS.check(key).map_err(RuntimesError::NotFound)?;
    let dir = runtimes_dir(cache_root)?;
    let mut found: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| crate::image::cache::is_hash(n) && n.starts_with(&prefix))
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    let one = DISKS
        .unique(&prefix, found)
        .map_err(RuntimesError::NotFound)?;
    let cache = Cache::open(cache_root)?;
    crate::image::cache::remove_dir_atomically(&dir.join(&one), &cache.tmp_dir()?)?;
    Ok(one)
}

/// `runtimes/` under the cache root.
fn runtimes_dir(cache_root: Option<&Path>) -> Result<PathBuf, RuntimesError> {
    Ok(Cache::open(cache_root)?.root().join(super::CACHE_SUBDIR))
}

/// Ensures the runtimes disk in the cache rooted at `cache_root`, with a line per step on
/// stderr (`runtimes: …`) and a last line saying whether it was built or cached.
pub fn ensure_logged(cache_root: Option<&Path>) -> Result<RuntimesDisk, RuntimesError> {
    let d = super::ensure_in(cache_root, &mut |line| eprintln!("runtimes: {line}"))?;
    eprintln!(
        "{} runtimes disk {} ({}, {}){}",
        if d.freshly_built { "built" } else { "cached" },
        short_key(d.key()),
        d.versions(),
        human_size(d.size()),
        match d.manifest.disk.as_ref() {
            Some(r) if d.freshly_built => format!(" in {:.0}s", r.build_seconds),
            _ => String::new(),
        }
    );
    Ok(d)
}

/// The first 12 hex digits of a key.
pub fn short_key(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

/// A disk as JSON: key, path, digest, size, versions, files.
pub fn disk_json(d: &RuntimesDisk) -> Value {
    let created = d.manifest.disk.as_ref().map_or(0, |r| r.created_unix);
    json!({
        "key": d.key(),
        "path": d.path,
        "sha256": d.digest,
        "size": d.size(),
        "current": super::current_key().as_deref() == Some(d.key()),
        "mount": d.manifest.mount,
        "packages": d.manifest.packages.iter().map(|p| json!({
            "name": p.name,
            "version": p.version,
            "tarball": p.tarball,
            "integrity": p.integrity,
            "files": p.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "debian": d.manifest.debian.iter().map(|r| json!({
            "package": r.package,
            "version": r.version,
            "file": r.file.path,
        })).collect::<Vec<_>>(),
        "created_unix": created,
        "age_seconds": crate::units::age(created),
    })
}

/// Prints the table of `voidbox runtimes ls` (and of `voidbox image ls`).
pub fn print_table(disks: &[RuntimesDisk]) {
    let current = super::current_key();
    let version = |d: &RuntimesDisk, name: &str| {
        d.manifest
            .package(name)
            .map_or("-".to_string(), |p| p.version.clone())
    };
    let debian = |d: &RuntimesDisk, name: &str| {
        d.manifest
            .debian
            .iter()
            .find(|r| r.package == name)
            .map_or("-".to_string(), |r| r.version.clone())
    };
    println!(
        "{:<14} {:<12} {:<20} {:<10} {:<14} {:>8} {:>5}",
        "RUNTIMES", "CLAUDE CODE", "CODEX", "MUSL", "BASH", "SIZE", "AGE"
    );
    for d in disks {
        let created = d.manifest.disk.as_ref().map_or(0, |r| r.created_unix);
        println!(
            "{:<14} {:<12} {:<20} {:<10} {:<14} {:>8} {:>5}{}",
            short_key(d.key()),
            version(d, super::CLAUDE_PACKAGE),
            version(d, super::CODEX_PACKAGE),
            debian(d, super::MUSL_PACKAGE),
            debian(d, super::BASH_PACKAGE),
            human_size(d.size()),
            human_age(crate::units::age(created)),
            if current.as_deref() == Some(d.key()) {
                ""
            } else {
                "  (not the pinned versions)"
            }
        );
    }
}

/// Verifies every cached runtimes disk (scratch space in the cache's `tmp/`), printing a
/// line per disk in [`Format::Human`]; returns how many failed and the JSON entries
/// (`{"runtimes": KEY, "ok": …}`). Unreadable entries count as failed.
pub fn verify_all(
    cache_root: Option<&Path>,
    format: Format,
) -> Result<(usize, Vec<Value>), RuntimesError> {
    let (disks, broken) = super::list(cache_root)?;
    let cache = Cache::open(cache_root)?;
    let mut failed = 0;
    let mut out = Vec::new();
    for (dir, e) in &broken {
        failed += 1;
        if format == Format::Human {
            println!("FAILED runtimes {}: {e}", dir.display());
        }
        out.push(json!({"runtimes": dir, "ok": false, "error": e.to_string()}));
    }
    if disks.is_empty() {
        return Ok((failed, out));
    }
    let tmp = cache.tmp_dir()?;
    for d in &disks {
        if d.manifest.layout != super::LAYOUT_VERSION {
            // Never used by this voidbox (its key differs): listed, not failed.
            if format == Format::Human {
                println!(
                    "stale runtimes {}: layout {} (this voidbox builds layout {}), never used; remove it with `voidbox runtimes rm {}`",
                    short_key(d.key()),
                    d.manifest.layout,
                    super::LAYOUT_VERSION,
                    short_key(d.key())
                );
            }
            out.push(json!({"runtimes": d.key(), "ok": true, "stale": true,
                "layout": d.manifest.layout}));
            continue;
        }
        let scratch = tempfile::Builder::new()
            .prefix("verify-runtimes-")
            .tempdir_in(&tmp)
            .map_err(RuntimesError::io(&tmp))?;
        match super::verify(d, scratch.path()) {
            Ok(r) => {
                if format == Format::Human {
                    println!(
                        "ok runtimes {} {} ({}, {} entries)",
                        short_key(d.key()),
                        d.versions(),
                        human_size(d.size()),
                        r.entries
                    );
                }
                out.push(json!({"runtimes": d.key(), "ok": true, "sha256": d.digest,
                    "size": d.size(), "entries": r.entries}));
            }
            Err(e) => {
                failed += 1;
                if format == Format::Human {
                    println!("FAILED runtimes {}: {e}", short_key(d.key()));
                }
                out.push(json!({"runtimes": d.key(), "ok": false, "error": e.to_string()}));
            }
        }
    }
    Ok((failed, out))
}
