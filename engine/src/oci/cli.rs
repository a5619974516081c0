//! `voidbox pull REF` and `voidbox oci ls|rm|prune`: the OCI image cache.
//!
//! Exit codes: 0 success; 2 usage (clap, a malformed reference or platform, an invalid
//! [`MAX_BYTES_ENV`]); 3 for every [`OciError`] (registry unreachable, access refused,
//! not found, digest mismatch, unsupported media type, nothing cached under that name…),
//! printed as one line: `error: pulling REF: <reason>`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use voidbox_oci::{CachedImage, ImageRef, Platform};

use super::{
    max_bytes, open_store, parse_registry_host, pull_into, pull_options_with, short_digest,
    OciError, Store, MAX_BYTES_ENV,
};
use crate::output::{Format, ProgressMode};
use crate::units::{human_age, human_size};

/// `voidbox pull` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = pull_after_help())]
pub struct PullArgs {
    /// Image reference, `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]` (`alpine` is
    /// `docker.io/library/alpine:latest`).
    #[arg(value_name = "REF", value_parser = parse_reference)]
    pub reference: String,
    /// A registry (`host` or `host:port`) that may be reached over plain HTTP; repeatable.
    /// Loopback registries always are; others use HTTPS unless listed here or in
    /// VOIDBOX_INSECURE_REGISTRIES (comma-separated).
    #[arg(long = "insecure-registry", value_name = "HOST", value_parser = parse_registry_host)]
    pub insecure_registries: Vec<String>,
    /// Platform picked from an image index, `os/arch[/variant]`.
    #[arg(long, value_name = "OS/ARCH", default_value = "linux/amd64", value_parser = parse_platform)]
    pub platform: Platform,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// OCI cache (default: $XDG_CACHE_HOME/voidbox/oci or ~/.cache/voidbox/oci).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

fn pull_after_help() -> String {
    format!(
        "Credentials: VOIDBOX_REGISTRY_USERNAME and VOIDBOX_REGISTRY_PASSWORD, else Docker's \
         config.json ($DOCKER_CONFIG or ~/.docker); never printed. The cache is capped by \
         {MAX_BYTES_ENV} (default {}): a pull that adds an image evicts the least recently \
         used others. Exit codes: 0 pulled or cached, 2 usage, 3 the image is unavailable \
         (unreachable registry, access refused, not found, digest mismatch, unsupported media type).",
        human_size(super::DEFAULT_MAX_BYTES)
    )
}

/// `voidbox oci` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum OciCommand {
    /// List cached images, most recently used first, with the cache's total and its cap.
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// OCI cache (default: $XDG_CACHE_HOME/voidbox/oci).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Remove cached images by reference or digest (prefix of at least 4 hex digits), or all.
    Rm {
        /// References (`alpine:3.20`) or digests (`sha256:ab12…`, `ab12…`).
        #[arg(
            value_name = "REF|DIGEST",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        targets: Vec<String>,
        /// Remove every cached image.
        #[arg(long)]
        all: bool,
        /// OCI cache.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Evict least recently used images until the cache fits in SIZE.
    Prune {
        /// Size to shrink to (e.g. 5G, 512M); default: VOIDBOX_OCI_MAX_BYTES, else 20G.
        #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
        max_bytes: Option<u64>,
        /// OCI cache.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
}

fn parse_reference(s: &str) -> Result<String, String> {
    ImageRef::parse(s)
        .map(|r| r.given().to_string())
        .map_err(|e| e.to_string())
}

fn parse_platform(s: &str) -> Result<Platform, String> {
    Platform::parse(s).map_err(|_| format!("`{s}` is not a platform `os/arch[/variant]`"))
}

/// Why a command failed: exit code and message.
type Failure = (u8, String);

/// Runs `voidbox pull`.
pub fn pull_cmd(args: &PullArgs) -> ExitCode {
    exit(pull(args))
}

/// Runs a `voidbox oci` subcommand.
pub fn run_cli(cmd: OciCommand) -> ExitCode {
    exit(match cmd {
        OciCommand::Ls { format, cache_dir } => ls(format, cache_dir),
        OciCommand::Rm {
            targets,
            all,
            cache_dir,
        } => rm(&targets, all, cache_dir),
        OciCommand::Prune {
            max_bytes,
            cache_dir,
        } => prune(max_bytes, cache_dir),
    })
}

fn exit(r: Result<(), Failure>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}

fn oci(e: OciError) -> Failure {
    (3, e.to_string())
}

fn open(cache_dir: Option<PathBuf>) -> Result<Store, Failure> {
    open_store(cache_dir.as_deref()).map_err(oci)
}

fn pull(args: &PullArgs) -> Result<(), Failure> {
    let reference = &args.reference;
    max_bytes().map_err(|e| (2, e))?;
    let store = open_store(args.cache_dir.as_deref())
        .map_err(|e| (3, format!("pulling {reference}: {e}")))?;
    let opts = pull_options_with(&args.insecure_registries, args.platform.clone());
    let p = pull_into(&store, reference, &opts, ProgressMode::Auto)
        .map_err(|e| (3, format!("pulling {reference}: {e}")))?;
    let img = &p.image;
    match args.format {
        Format::Json => {
            let doc = serde_json::json!({
                "reference": img.reference,
                "digest": img.manifest_digest,
                "rootfs_disk": img.rootfs_disk,
                "disk_bytes": img.disk_bytes,
                "layers": img.layers,
                "cache_hit": img.cache_hit,
                "seconds": p.elapsed.as_secs_f64(),
                "config": img.config,
                "evicted": p.evicted.iter().map(|c| &c.manifest_digest).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        Format::Human => {
            println!("digest: {}", img.manifest_digest);
            println!("disk:   {}", img.rootfs_disk.display());
            println!("size:   {}", human_size(img.disk_bytes));
            println!("layers: {}", img.layers);
            if img.cache_hit {
                println!("cached: yes (nothing downloaded)");
            } else {
                println!("cached: no (pulled in {:.1}s)", p.elapsed.as_secs_f64());
            }
        }
    }
    Ok(())
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn ago(t: SystemTime) -> String {
    human_age(crate::units::age(unix(t)))
}

fn references(c: &CachedImage) -> String {
    if c.references.is_empty() {
        "<none>".to_string()
    } else {
        c.references.join(", ")
    }
}

/// The cap for display: a broken [`MAX_BYTES_ENV`] is a warning here, not a failure.
fn cap_or_warn() -> Option<u64> {
    max_bytes().map_err(|e| eprintln!("warning: {e}")).ok()
}

fn ls(format: Format, cache_dir: Option<PathBuf>) -> Result<(), Failure> {
    let store = open(cache_dir)?;
    let images = store.list().map_err(oci)?;
    let total: u64 = images.iter().map(|c| c.bytes).sum();
    let cap = cap_or_warn();
    match format {
        Format::Json => {
            let list: Vec<_> = images
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "digest": c.manifest_digest,
                        "references": c.references,
                        "rootfs_disk": c.rootfs_disk,
                        "bytes": c.bytes,
                        "layers": c.layers,
                        "has_kernel": c.has_kernel,
                        "created_unix": unix(c.created),
                        "last_used_unix": unix(c.last_used),
                    })
                })
                .collect();
            let doc = serde_json::json!({
                "root": store.root(),
                "images": list,
                "total_bytes": total,
                "max_bytes": cap,
            });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        Format::Human if images.is_empty() => {
            eprintln!("no OCI images in {}", store.root().display());
        }
        Format::Human => {
            let width = images
                .iter()
                .map(|c| references(c).chars().count())
                .max()
                .unwrap_or(0)
                .max("REFERENCE".len());
            println!(
                "{:<width$}  {:<12}  {:>8}  {:>6}  {:>7}  {:>9}",
                "REFERENCE", "DIGEST", "SIZE", "LAYERS", "CREATED", "LAST-USED"
            );
            for c in &images {
                let hex = c.manifest_digest.trim_start_matches("sha256:");
                println!(
                    "{:<width$}  {:<12}  {:>8}  {:>6}  {:>7}  {:>9}",
                    references(c),
                    hex.get(..12).unwrap_or(hex),
                    human_size(c.bytes),
                    c.layers,
                    ago(c.created),
                    ago(c.last_used),
                );
            }
            eprintln!(
                "{} image(s), {} of {} ({MAX_BYTES_ENV})",
                images.len(),
                human_size(total),
                cap.map_or_else(|| "?".to_string(), human_size),
            );
        }
    }
    Ok(())
}

/// The digest `what` names among `all`, by the rules of [`Store::remove`]: a reference's
/// last resolution (or its pinned digest), else a digest or digest prefix of at least 4 hex
/// digits that matches exactly one image.
fn resolve(all: &[CachedImage], what: &str) -> Result<String, OciError> {
    let what = what.trim();
    let prefix = what.strip_prefix("sha256:");
    if prefix.is_none() {
        if let Ok(image) = ImageRef::parse(what) {
            let canonical = image.canonical();
            if let Some(c) = all.iter().find(|c| c.references.contains(&canonical)) {
                return Ok(c.manifest_digest.clone());
            }
            if let Some(d) = image.digest() {
                if let Some(c) = all.iter().find(|c| c.manifest_digest == d.as_str()) {
                    return Ok(c.manifest_digest.clone());
                }
            }
        }
    }
    let hex = prefix.unwrap_or(what).to_ascii_lowercase();
    let is_hex = (4..=64).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit());
    let matches: Vec<&CachedImage> = all
        .iter()
        .filter(|c| {
            is_hex
                && c.manifest_digest
                    .trim_start_matches("sha256:")
                    .starts_with(&hex)
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.manifest_digest.clone()),
        [] => Err(OciError::NotCached(what.to_string())),
        many => Err(OciError::Ambiguous {
            what: what.to_string(),
            count: many.len(),
        }),
    }
}

fn rm(targets: &[String], all: bool, cache_dir: Option<PathBuf>) -> Result<(), Failure> {
    let store = open(cache_dir)?;
    let images = store.list().map_err(oci)?;
    let mut digests: Vec<String> = if all {
        images.iter().map(|c| c.manifest_digest.clone()).collect()
    } else {
        // Resolve everything first so a typo removes nothing.
        targets
            .iter()
            .map(|t| resolve(&images, t))
            .collect::<Result<_, _>>()
            .map_err(oci)?
    };
    digests.dedup();
    let mut freed = 0;
    for d in &digests {
        for gone in store.remove(d).map_err(oci)? {
            freed += gone.bytes;
            eprintln!(
                "removed {} {} ({})",
                short_digest(&gone.manifest_digest),
                references(&gone),
                human_size(gone.bytes)
            );
        }
    }
    if all || digests.len() > 1 {
        eprintln!(
            "removed {} image(s), {} freed",
            digests.len(),
            human_size(freed)
        );
    }
    Ok(())
}

fn prune(max: Option<u64>, cache_dir: Option<PathBuf>) -> Result<(), Failure> {
    let cap = match max {
        Some(m) => m,
        None => max_bytes().map_err(|e| (2, e))?,
    };
    let store = open(cache_dir)?;
    let evicted = store.prune(cap).map_err(oci)?;
    for gone in &evicted {
        eprintln!(
            "evicted {} {} ({}, last used {} ago)",
            short_digest(&gone.manifest_digest),
            references(gone),
            human_size(gone.bytes),
            ago(gone.last_used)
        );
    }
    let left = store.list().map_err(oci)?;
    let total: u64 = left.iter().map(|c| c.bytes).sum();
    eprintln!(
        "evicted {} image(s); {} image(s) left, {} of {}",
        evicted.len(),
        left.len(),
        human_size(total),
        human_size(cap)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Pull {
        #[command(flatten)]
        a: PullArgs,
    }

    #[derive(clap::Parser)]
    struct Oci {
        #[command(subcommand)]
        c: OciCommand,
    }

    #[test]
    fn pull_arguments_parse_and_refuse_bad_references() {
        let p = Pull::try_parse_from([
            "x",
            "127.0.0.1:5000/app:v1",
            "--insecure-registry",
            "reg:5000",
            "--insecure-registry",
            "10.0.0.1",
            "--platform",
            "linux/arm64",
            "--format",
            "json",
        ])
        .unwrap();
        assert_eq!(p.a.reference, "127.0.0.1:5000/app:v1");
        assert_eq!(p.a.insecure_registries, ["reg:5000", "10.0.0.1"]);
        assert_eq!(p.a.platform.to_string(), "linux/arm64");
        assert_eq!(p.a.format, Format::Json);
        let d = Pull::try_parse_from(["x", "alpine"]).unwrap();
        assert_eq!(d.a.platform, Platform::default());
        for bad in [
            vec!["x"],
            vec!["x", "Has Space/x"],
            vec!["x", "app@sha256:1234"],
            vec!["x", "app", "--platform", "linux"],
            vec!["x", "app", "--insecure-registry", "http://reg"],
        ] {
            let e = Pull::try_parse_from(&bad).err().unwrap();
            assert!(e.use_stderr(), "{bad:?}");
        }
    }

    #[test]
    fn oci_subcommands_parse() {
        assert!(Oci::try_parse_from(["x", "ls", "--format", "json"]).is_ok());
        assert!(
            Oci::try_parse_from(["x", "rm"]).is_err(),
            "rm needs targets or --all"
        );
        assert!(Oci::try_parse_from(["x", "rm", "--all", "abcd"]).is_err());
        let p = Oci::try_parse_from(["x", "prune", "--max-bytes", "512M"]).unwrap();
        assert!(matches!(p.c, OciCommand::Prune { max_bytes: Some(m), .. } if m == 512 << 20));
        assert!(Oci::try_parse_from(["x", "prune", "--max-bytes", "lots"]).is_err());
    }

    fn cached(digest_byte: &str, refs: &[&str]) -> CachedImage {
        CachedImage {
            manifest_digest: format!("sha256:{}", digest_byte.repeat(64 / digest_byte.len())),
            references: refs.iter().map(|r| r.to_string()).collect(),
            rootfs_disk: PathBuf::from("/x"),
            bytes: 1,
            layers: 1,
            has_kernel: false,
            created: SystemTime::UNIX_EPOCH,
            last_used: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn rm_targets_resolve_like_the_store() {
        let all = [
            cached("ab", &["docker.io/library/alpine:3.20"]),
            cached("ac", &[]),
            cached("0f", &["127.0.0.1:5000/app:v1"]),
        ];
        let d = |i: usize| all[i].manifest_digest.clone();
        assert_eq!(resolve(&all, "alpine:3.20").unwrap(), d(0));
        assert_eq!(resolve(&all, "127.0.0.1:5000/app:v1").unwrap(), d(2));
        assert_eq!(resolve(&all, "abab").unwrap(), d(0));
        assert_eq!(resolve(&all, "sha256:ACAC").unwrap(), d(1));
        assert_eq!(resolve(&all, &d(2)).unwrap(), d(2));
        let pinned = format!("other.example/x@{}", d(1));
        assert_eq!(resolve(&all, &pinned).unwrap(), d(1));
        assert!(matches!(resolve(&all, "a"), Err(OciError::NotCached(_))));
        assert!(matches!(
            resolve(&all, "alpine:3.21"),
            Err(OciError::NotCached(_))
        ));
        assert!(matches!(
            resolve(&all, "sha256:"),
            Err(OciError::NotCached(_))
        ));
        let mut other = cached("ab", &[]);
        other.manifest_digest = format!("sha256:abab{}", "cd".repeat(30));
        let two = [cached("ab", &[]), other];
        assert!(matches!(
            resolve(&two, "abab"),
            Err(OciError::Ambiguous { count: 2, .. })
        ));
    }
}
