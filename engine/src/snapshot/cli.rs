//! `voidbox snapshot create|ls|rm`: the golden snapshot cache.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::store::{self, Store};
use super::{create, CreateOptions, GoldenSpec, LockMode};
use crate::output::{Format, ProgressMode};
use crate::sandbox::{check_kvm, GuestImage, SandboxError, VmmLauncher};
use crate::units::{human_age, human_size};

/// `voidbox snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Create (or re-create) the golden snapshot for a VM size: one cold boot to "guest agent
    /// ready", then the snapshot. `apply` creates missing ones by itself on first use.
    Create {
        /// Guest memory in MiB (the spec's `sandbox.memory_mb`, 64..=65536); the default is
        /// `voidbox run`'s, so `create` without options makes the snapshot `run` restores.
        #[arg(long, default_value_t = crate::limits::DEFAULT_RUN_MEMORY_MB, value_parser = crate::limits::memory_mb_arg())]
        memory_mb: u32,
        /// vCPUs (the spec's `sandbox.vcpus`, 1..=32).
        #[arg(long, default_value_t = 1, value_parser = crate::limits::vcpus_arg())]
        vcpus: u8,
        /// Snapshot a VM with a network device (what nodes with `network:` restore from;
        /// the policy is not part of a snapshot). DNS upstreams: `VOIDBOX_DNS_UPSTREAMS`.
        #[arg(long)]
        network: bool,
        /// Replace an existing snapshot of the same key.
        #[arg(long)]
        force: bool,
        /// Seconds to wait for the guest agent of the cold boot.
        #[arg(long, value_name = "SECS", default_value_t = 300)]
        boot_timeout: u64,
        /// Snapshot cache (default: $XDG_CACHE_HOME/voidbox/snapshots).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Print the result as JSON on stdout.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// List cached snapshots, most recently used first, each base followed by the diffs
    /// over it (warm runtimes), indented.
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Snapshot cache.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Remove snapshots by key prefix, or all of them. A base that diffs need is refused
    /// unless they go too (listed, or `--with-dependents`).
    Rm {
        /// Key prefixes.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        keys: Vec<String>,
        /// Remove every snapshot.
        #[arg(long)]
        all: bool,
        /// Also remove the diffs over the given snapshots.
        #[arg(long)]
        with_dependents: bool,
        /// Snapshot cache.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
}

/// Runs a `voidbox snapshot` subcommand: 0 success, 2 usage/cache errors, 3 environment.
pub fn run_cli(cmd: SnapshotCommand) -> ExitCode {
    match run(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}

type CliResult = Result<(), (u8, String)>;

fn store_err(e: super::StoreError) -> (u8, String) {
    let code = if matches!(e, super::StoreError::Environment(_)) {
        3
    } else {
        2
    };
    (code, e.to_string())
}

fn sandbox_err(e: SandboxError) -> (u8, String) {
    (3, e.to_string())
}

fn entry_json(e: &store::Entry) -> serde_json::Value {
    serde_json::json!({
        "key": e.meta.key,
        "dir": e.dir,
        "memory_mb": e.meta.memory_mb,
        "vcpus": e.meta.vcpus,
        "image_hash": e.meta.image_hash,
        "image_key": e.meta.image_key,
        "extra_cmdline": e.meta.extra_cmdline,
        "network": e.meta.network,
        "disk_bytes": e.disk_bytes,
        "state_bytes": e.meta.state_bytes,
        "boot_ms": e.meta.boot_ms,
        "snapshot_ms": e.meta.snapshot_ms,
        "pause_us": e.meta.pause_us,
        "created_unix": e.meta.created_unix,
        "last_used_unix": unix(e.last_used),
        "kind": e.meta.kind(),
        "base": e.meta.base,
        "warm": e.meta.warm,
    })
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn age(unix_secs: u64) -> String {
    human_age(crate::units::age(unix_secs))
}

/// Runs a `voidbox snapshot` subcommand: 0 success, 2 usage/cache errors, 3 environment.
fn run(cmd: SnapshotCommand) -> CliResult {
    match cmd {
        SnapshotCommand::Create {
            memory_mb,
            vcpus,
            network,
            force,
            boot_timeout,
            cache_dir,
            format,
        } => create_cmd(
            memory_mb,
            vcpus,
            network,
            force,
            boot_timeout,
            cache_dir,
            format,
        ),
        SnapshotCommand::Ls { format, cache_dir } => ls(format, cache_dir),
        SnapshotCommand::Rm {
            keys,
            all,
            with_dependents,
            cache_dir,
        } => rm(keys, all, with_dependents, cache_dir),
    }
}

/// `voidbox snapshot create`.
fn create_cmd(
    memory_mb: u32,
    vcpus: u8,
    network: bool,
    force: bool,
    boot_timeout: u64,
    cache_dir: Option<PathBuf>,
    format: Format,
) -> CliResult {
    let network = if network {
        let upstreams = crate::network::upstreams::from_env().map_err(|e| (2, e))?;
        Some(crate::network::nat_config(
            crate::network::creator_policy(),
            &upstreams,
        ))
    } else {
        None
    };
    let store = Store::open(cache_dir.as_deref()).map_err(store_err)?;
    check_kvm().map_err(sandbox_err)?;
    let image = GuestImage::ensure(ProgressMode::Auto).map_err(sandbox_err)?;
    let spec = GoldenSpec {
        image,
        memory_mb,
        vcpus,
        extra_cmdline: Vec::new(),
        disks: Default::default(),
        network,
        share_slots: false,
    };
    let key = spec.key();
    let _lock = store
        .lock(&key, LockMode::Exclusive, true)
        .map_err(store_err)?;
    let existing = store.get(&key).ok().flatten();
    let entry = match existing {
        Some(e) if !force => {
            eprintln!(
                "snapshot {} exists (use --force to re-create it)",
                &key[..12]
            );
            e
        }
        _ => {
            eprintln!(
                "creating snapshot {} ({memory_mb} MiB, {vcpus} vCPU): cold boot…",
                &key[..12]
            );
            let opts = CreateOptions {
                launcher: VmmLauncher::default(),
                boot_timeout: Duration::from_secs(boot_timeout),
                runtime_dir: None,
            };
            let e = create(&store, &spec, &opts).map_err(sandbox_err)?;
            eprintln!(
                "created snapshot {} in {:.1}s (boot {:.1}s, snapshot {} ms, vCPUs paused {} µs), {} on disk",
                &key[..12],
                (e.meta.boot_ms + e.meta.snapshot_ms) as f64 / 1000.0,
                e.meta.boot_ms as f64 / 1000.0,
                e.meta.snapshot_ms,
                e.meta.pause_us,
                human_size(e.disk_bytes)
            );
            let cap = store::max_bytes().map_err(|e| (2, e))?;
            for gone in store.evict(cap, &key) {
                eprintln!("evicted {} (cache over {})", &gone[..12], human_size(cap));
            }
            e
        }
    };
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&entry_json(&entry)).unwrap_or_default()
        ),
        Format::Human => println!("{}", entry.dir.display()),
    }
    Ok(())
}

/// `voidbox snapshot ls`.
fn ls(format: Format, cache_dir: Option<PathBuf>) -> CliResult {
    let store = Store::open(cache_dir.as_deref()).map_err(store_err)?;
    let (entries, broken) = store.list().map_err(store_err)?;
    match format {
        Format::Json => {
            let v: Vec<_> = entries.iter().map(entry_json).collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Format::Human if entries.is_empty() => {
            eprintln!("no snapshots in {}", store.root().display());
        }
        Format::Human => {
            // BOOTS tells apart entries of one size and image: what the VM booted
            // (command line, image disks such as the runtimes disk or an OCI root
            // filesystem, the network device), the identity a restore checks.
            // Diffs (KIND `warm …`) are listed under their base, indented.
            println!(
                "{:<14} {:>7} {:>5} {:<3} {:<14} {:<14} {:>8} {:>8} {:>9}  KIND",
                "KEY", "MEMORY", "VCPUS", "NET", "IMAGE", "BOOTS", "SIZE", "CREATED", "LAST-USED"
            );
            for (e, layer) in layered(&entries) {
                let m = &e.meta;
                let (key, kind) = match layer {
                    Layer::Full => (m.key[..12].to_string(), m.kind()),
                    Layer::Diff => (format!("└ {}", &m.key[..12]), m.kind()),
                    Layer::Orphan => (
                        m.key[..12].to_string(),
                        format!(
                            "{} (base {} is missing)",
                            m.kind(),
                            m.base.as_deref().map_or("", |b| &b[..b.len().min(12)])
                        ),
                    ),
                };
                println!(
                    "{:<14} {:>7} {:>5} {:<3} {:<14} {:<14} {:>8} {:>8} {:>9}  {kind}",
                    key,
                    format!("{}M", m.memory_mb),
                    m.vcpus,
                    if m.network { "yes" } else { "-" },
                    &m.image_hash[..m.image_hash.len().min(12)],
                    &m.image_key[..m.image_key.len().min(12)],
                    human_size(e.disk_bytes),
                    age(m.created_unix),
                    age(unix(e.last_used)),
                );
            }
            let total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
            let diffs = entries.iter().filter(|e| e.meta.base.is_some()).count();
            let cap = store::max_bytes().unwrap_or(store::DEFAULT_MAX_BYTES);
            eprintln!(
                "{} snapshot(s){}, {} of {} ({})",
                entries.len(),
                if diffs > 0 {
                    format!(" ({diffs} diff(s) over a base)")
                } else {
                    String::new()
                },
                human_size(total),
                human_size(cap),
                store::MAX_BYTES_ENV
            );
        }
    }
    for (dir, e) in &broken {
        eprintln!("warning: {}: {e}", dir.display());
    }
    Ok(())
}

/// Where an entry sits in the listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    /// A full snapshot (a base, or one without diffs).
    Full,
    /// A diff listed under its base.
    Diff,
    /// A diff whose base is not in the cache (or unreadable).
    Orphan,
}

/// `entries` (most recently used first) in listing order: each full snapshot followed by
/// the diffs over it, then the diffs without a base.
fn layered(entries: &[store::Entry]) -> Vec<(&store::Entry, Layer)> {
    let full = |k: &str| {
        entries
            .iter()
            .any(|e| e.meta.key == k && e.meta.base.is_none())
    };
    let mut out = Vec::with_capacity(entries.len());
    for e in entries.iter().filter(|e| e.meta.base.is_none()) {
        out.push((e, Layer::Full));
        for d in entries
            .iter()
            .filter(|d| d.meta.base.as_deref() == Some(e.meta.key.as_str()))
        {
            out.push((d, Layer::Diff));
        }
    }
    for e in entries {
        if e.meta.base.as_deref().is_some_and(|b| !full(b)) {
            out.push((e, Layer::Orphan));
        }
    }
    out
}

/// `voidbox snapshot rm`.
fn rm(
    keys: Vec<String>,
    all: bool,
    with_dependents: bool,
    cache_dir: Option<PathBuf>,
) -> CliResult {
    let store = Store::open(cache_dir.as_deref()).map_err(store_err)?;
    let resolved = if all {
        let (entries, broken) = store.list().map_err(store_err)?;
        // Diffs before their bases.
        let (diffs, full): (Vec<_>, Vec<_>) =
            entries.into_iter().partition(|e| e.meta.base.is_some());
        let mut v: Vec<String> = diffs.into_iter().chain(full).map(|e| e.meta.key).collect();
        v.extend(
            broken
                .iter()
                .filter_map(|(d, _)| d.file_name()?.to_str().map(str::to_string)),
        );
        v
    } else {
        // Resolve everything first so a typo removes nothing.
        keys.iter()
            .map(|k| store.resolve(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_err)?
    };
    let mut removed = 0;
    if with_dependents {
        for k in &resolved {
            // Gone already when it was a diff over an earlier one.
            if !store.entry_dir(k).exists() {
                continue;
            }
            for gone in store.remove_with_dependents(k).map_err(store_err)? {
                eprintln!("removed {gone}");
                removed += 1;
            }
        }
    } else {
        // A base is refused, removing nothing, unless its diffs go too; they go first.
        let mut bases = Vec::new();
        let mut ordered = Vec::with_capacity(resolved.len());
        for k in &resolved {
            let dependents = store.dependents(k);
            let left: Vec<String> = dependents
                .iter()
                .filter(|d| !resolved.contains(d))
                .cloned()
                .collect();
            if !left.is_empty() {
                return Err(store_err(super::StoreError::HasDependents {
                    key: k.clone(),
                    dependents: left,
                }));
            }
            if dependents.is_empty() {
                ordered.push(k);
            } else {
                bases.push(k);
            }
        }
        for k in ordered.into_iter().chain(bases) {
            store.remove(k).map_err(store_err)?;
            eprintln!("removed {k}");
            removed += 1;
        }
    }
    if all {
        eprintln!("removed {removed} snapshot(s)");
    }
    Ok(())
}
