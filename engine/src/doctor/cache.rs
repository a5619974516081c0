//! Cache checks: the guest image (cached and current for this host's profile, or
//! buildable), the runtimes disk, the golden snapshots, that the snapshot cache is
//! writable, and free space in the cache root.

use std::path::{Path, PathBuf};

use super::host::{BuildDeps, Readiness};
use super::{Check, HostProfile, Status};
use crate::image::Cache;
use crate::sandbox::GuestImage;
use crate::snapshot::store::{self, Store};
use crate::units::{human_age, human_size};

/// Name of the guest image check.
pub const IMAGE: &str = "guest-image";
/// Name of the runtimes disk check.
pub const RUNTIMES: &str = "runtimes";
/// Name of the golden snapshot check.
pub const SNAPSHOTS: &str = "snapshots";
/// Name of the free space check.
pub const DISK: &str = "disk-space";
/// Name of the cache writability check.
pub const WRITABLE: &str = "cache-writable";

/// Peak space of a first image build: the `linux-source-6.1` tree (≈1.3 GiB unpacked)
/// plus the objects of the small guest config (≈0.4 GiB) in the cache's `tmp/`; freed
/// afterwards (the image itself is ≈25 MB).
pub const IMAGE_BUILD_BYTES: u64 = 1792 << 20;
/// Space of a first runtimes disk build: the erofs disk (≈640 MiB) plus the npm tarballs
/// (≈335 MB) it is made from.
pub const RUNTIMES_BUILD_BYTES: u64 = 1 << 30;
/// Free space below which the cache root fails: even with everything built, a golden
/// snapshot's memory file (sparse, 25–50 MB for a fresh guest, up to the guest's memory),
/// an OCI disk (hundreds of MB) or a run's logs can fill it.
pub const FAIL_BELOW_BYTES: u64 = 1 << 30;
/// Free space below which the cache root warns: a first image + runtimes build needs
/// ≈2.75 GiB at its peak, and the snapshot cache grows to its 4 GiB default cap
/// ([`store::DEFAULT_MAX_BYTES`]) before evicting.
pub const WARN_BELOW_BYTES: u64 = 5 << 30;

/// The guest image finding, with what later checks need.
#[derive(Debug, Clone)]
pub struct ImageFinding {
    /// The check.
    pub check: Check,
    /// A current image for this host is cached.
    pub present: bool,
    /// Its hash (snapshots are keyed by it).
    pub current: Option<String>,
    /// Space a build of the missing image needs.
    pub build_bytes: u64,
}

/// The runtimes disk finding.
#[derive(Debug, Clone)]
pub struct RuntimesFinding {
    /// The check.
    pub check: Check,
    /// Space a build of the missing disk needs.
    pub build_bytes: u64,
}

fn no_root(name: &'static str, why: &str) -> Check {
    Check::fail(
        name,
        format!("no cache location: {why}"),
        "set HOME (or XDG_CACHE_HOME) to a writable directory",
    )
}

/// Is a current image (the layout and recipe this build boots, [`GuestImage::from_cached`])
/// of the host's profile cached? If not, can `apply` build it (warn) or not (fail)?
pub fn image_check(
    root: &Result<PathBuf, String>,
    profile: HostProfile,
    build: &BuildDeps,
) -> ImageFinding {
    let finding = |check, current: Option<String>| ImageFinding {
        check,
        present: current.is_some(),
        build_bytes: if current.is_some() {
            0
        } else {
            IMAGE_BUILD_BYTES
        },
        current,
    };
    if let Some((check, current)) = bundled_image(profile) {
        return finding(check, current);
    }
    let root = match root {
        Ok(r) => r,
        Err(e) => return finding(no_root(IMAGE, e), None),
    };
    let cache = Cache::new(root);
    let (images, broken) = match cache.list() {
        Ok(l) => l,
        Err(e) => {
            return finding(
                Check::fail(
                    IMAGE,
                    format!("cannot read the image cache: {e}"),
                    format!(
                        "make {} readable by this user",
                        cache.images_dir().display()
                    ),
                ),
                None,
            )
        }
    };
    let fits = |p| profile.is_none_or(|want| want == p);
    let mut current = None;
    let mut stale = Vec::new();
    for i in &images {
        match GuestImage::from_cached(&i.dir, &i.manifest) {
            Some(g) if current.is_none() && fits(i.manifest.profile) => current = Some((i, g)),
            Some(_) => {}
            None => stale.push(i),
        }
    }
    let mut extra = String::new();
    if !stale.is_empty() {
        let bytes: u64 = stale
            .iter()
            .flat_map(|i| i.manifest.artifacts())
            .map(|a| a.size)
            .sum();
        let hashes: Vec<&str> = stale
            .iter()
            .map(|i| i.manifest.hash.get(..12).unwrap_or(&i.manifest.hash))
            .collect();
        extra.push_str(&format!(
            "; {} stale image(s) (older builder, recipe or layout; {}), never booted: `voidbox image rm {}`",
            stale.len(),
            human_size(bytes),
            hashes.join(" ")
        ));
    }
    if !broken.is_empty() {
        extra.push_str(&format!(
            "; {} unreadable image dir(s) (`voidbox image ls` names them)",
            broken.len()
        ));
    }
    let which = profile.map_or_else(
        || "any profile, KVM unknown".to_string(),
        |p| format!("profile {p}"),
    );
    if let Some((i, g)) = current {
        let m = &i.manifest;
        let check = Check::ok(
            IMAGE,
            format!(
                "image {} ({}, kernel {}, system disk {}), built {} ago{extra}",
                m.hash.get(..12).unwrap_or(&m.hash),
                m.profile,
                m.kernel.release,
                human_size(m.system_disk.as_ref().map_or(0, |a| a.size)),
                human_age(crate::units::age(m.created_unix)),
            ),
        );
        return finding(check, Some(g.hash));
    }
    let missing = format!(
        "no current guest image ({which}) in {}",
        cache.images_dir().display()
    );
    let check = match build.readiness() {
        Readiness::Ready => Check::warn(
            IMAGE,
            format!("{missing}: the first apply/run builds it, taking minutes (≈15 on 2 cores){extra}"),
            "build it now: `voidbox image build`",
        ),
        Readiness::AfterApt(pkgs) => Check::warn(
            IMAGE,
            format!(
                "{missing}: the first apply/run installs {} with apt-get and builds it, taking minutes{extra}",
                pkgs.join(" ")
            ),
            "build it now: `voidbox image build` (needs network for apt-get)",
        ),
        Readiness::Blocked(why, fix) => Check::fail(
            IMAGE,
            format!("{missing}, and it cannot be built here: {why}{extra}"),
            format!("{fix}; then `voidbox image build`"),
        ),
    };
    finding(check, None)
}

/// The image bundled beside the executable for the host's profile, if there is one: ok
/// when it matches its manifest (with its hash), a failure (reinstall) when it does not.
/// Where the profile is unknown (no usable `/dev/kvm` to probe), every bundled image counts.
fn bundled_image(profile: HostProfile) -> Option<(Check, Option<String>)> {
    let usable = |i: &crate::image::cache::CachedImage| {
        GuestImage::from_cached(&i.dir, &i.manifest).is_some()
    };
    let Some(want) = profile else {
        return bundled_any_profile(usable);
    };
    let (check, hash) = match crate::image::bundle::find(want, usable) {
        Ok(None) => return None,
        Ok(Some(i)) => {
            let m = &i.manifest;
            (
                Check::ok(
                    IMAGE,
                    format!(
                        "image {} ({}, kernel {}), bundled in {} (verified)",
                        m.hash.get(..12).unwrap_or(&m.hash),
                        m.profile,
                        m.kernel.release,
                        i.dir.parent().unwrap_or(&i.dir).display()
                    ),
                ),
                Some(m.hash.clone()),
            )
        }
        Err(e) => (
            Check::fail(
                IMAGE,
                format!("the bundled guest image is unusable: {e}"),
                "reinstall voidbox (or unset VOIDBOX_BUNDLE_DIR)",
            ),
            None,
        ),
    };
    Some((check, hash))
}

/// The bundled images of every profile, for a host whose profile is unknown: ok (nothing to
/// build once `/dev/kvm` is usable; the `kvm` check says how), with the first one's hash.
fn bundled_any_profile(
    usable: impl Fn(&crate::image::cache::CachedImage) -> bool,
) -> Option<(Check, Option<String>)> {
    match crate::image::bundle::find_all(usable) {
        Ok(images) => {
            let first = images.first()?;
            let list: Vec<String> = images
                .iter()
                .map(|i| {
                    let m = &i.manifest;
                    format!("{} ({})", m.hash.get(..12).unwrap_or(&m.hash), m.profile)
                })
                .collect();
            let dir = first.dir.parent().unwrap_or(&first.dir);
            Some((
                Check::ok(
                    IMAGE,
                    format!(
                        "image {} bundled in {} (verified): nothing to build; which one boots is \
                         decided once /dev/kvm is usable (see the kvm check)",
                        list.join(", "),
                        dir.display()
                    ),
                ),
                Some(first.manifest.hash.clone()),
            ))
        }
        Err(e) => Some((
            Check::fail(
                IMAGE,
                format!("the bundled guest image is unusable: {e}"),
                "reinstall voidbox (or unset VOIDBOX_BUNDLE_DIR)",
            ),
            None,
        )),
    }
}

/// Can golden snapshots be saved and locked in the cache? Where they cannot, every VM boots
/// cold (a warning: VMs still run).
pub fn writable_check(root: &Result<PathBuf, String>) -> Check {
    let root = match root {
        Ok(r) => r,
        Err(e) => return no_root(WRITABLE, e).with_status(Status::Warn),
    };
    match store::write_problem(&root.join("snapshots")) {
        None => Check::ok(
            WRITABLE,
            format!(
                "{} is writable: golden snapshots can be made and restored",
                root.display()
            ),
        ),
        Some((why, fix)) => Check::warn(
            WRITABLE,
            format!(
                "{why}: no golden snapshot can be made or restored, so every VM boots cold \
                 (several times slower: ≈9× for a fan-out on an emulating KVM)"
            ),
            fix,
        ),
    }
}

/// Is the runtimes disk of the pinned agent CLIs cached (no network)?
pub fn runtimes_check(root: &Result<PathBuf, String>) -> RuntimesFinding {
    let root = match root {
        Ok(r) => r,
        Err(e) => {
            return RuntimesFinding {
                check: no_root(RUNTIMES, e).with_status(Status::Warn),
                build_bytes: 0,
            }
        }
    };
    let older = |keep: Option<&str>| {
        let (disks, _) = crate::runtimes::list(Some(root)).unwrap_or_default();
        let old: Vec<_> = disks.iter().filter(|d| Some(d.key()) != keep).collect();
        if old.is_empty() {
            String::new()
        } else {
            format!(
                "; {} older disk(s) ({}) unused",
                old.len(),
                human_size(old.iter().map(|d| d.size()).sum())
            )
        }
    };
    match crate::runtimes::cached_in(Some(root)) {
        Ok(Some(d)) => RuntimesFinding {
            check: Check::ok(
                RUNTIMES,
                format!(
                    "runtimes disk {} ({}, {}){}",
                    crate::runtimes::cli::short_key(d.key()),
                    d.versions(),
                    human_size(d.size()),
                    older(Some(d.key()))
                ),
            ),
            build_bytes: 0,
        },
        Ok(None) if crate::runtimes::current_key().is_none() => RuntimesFinding {
            check: Check::warn(
                RUNTIMES,
                format!(
                    "no runtimes disk, and it cannot be built until Debian's {} and {} are installed \
                     (see {}){}",
                    crate::runtimes::MUSL_PACKAGE,
                    crate::runtimes::BASH_PACKAGE,
                    super::host::TOOLS_RUNTIMES,
                    older(None)
                ),
                format!(
                    "sudo apt-get install {} {}, then `voidbox runtimes build`",
                    crate::runtimes::MUSL_PACKAGE,
                    crate::runtimes::BASH_PACKAGE
                ),
            ),
            build_bytes: RUNTIMES_BUILD_BYTES,
        },
        Ok(None) => RuntimesFinding {
            check: Check::warn(
                RUNTIMES,
                format!(
                    "no runtimes disk of the pinned Claude Code / Codex: the first agent node using them \
                     downloads ≈335 MB from the npm registry and builds it{}",
                    older(None)
                ),
                "build it now: `voidbox runtimes build` (needs network)",
            ),
            build_bytes: RUNTIMES_BUILD_BYTES,
        },
        Err(e) => RuntimesFinding {
            check: Check::warn(
                RUNTIMES,
                format!("cannot read the runtimes cache: {e}"),
                format!(
                    "make {} readable by this user",
                    root.join(crate::runtimes::CACHE_SUBDIR).display()
                ),
            ),
            build_bytes: 0,
        },
    }
}

/// How many golden snapshots there are, their size against the cache cap, and whether one
/// was taken of the current image by this voidbox version (VMs restore from those).
pub fn snapshots_check(root: &Result<PathBuf, String>, current_image: Option<&str>) -> Check {
    let root = match root {
        Ok(r) => r,
        Err(e) => return no_root(SNAPSHOTS, e).with_status(Status::Warn),
    };
    let store = match Store::open(Some(&root.join("snapshots"))) {
        Ok(s) => s,
        Err(e) => return no_root(SNAPSHOTS, &e.to_string()).with_status(Status::Warn),
    };
    let (entries, broken) = match store.list() {
        Ok(l) => l,
        Err(e) => {
            return Check::warn(
                SNAPSHOTS,
                format!("cannot read the snapshot cache: {e}"),
                format!("make {} readable by this user", store.root().display()),
            )
        }
    };
    let bytes: u64 = entries.iter().map(|e| e.disk_bytes).sum();
    let cap = match store::max_bytes() {
        Ok(c) => human_size(c),
        Err(e) => {
            return Check::warn(
                SNAPSHOTS,
                format!("{}: {e}", store::MAX_BYTES_ENV),
                format!(
                    "set {} to a size such as 4GiB, or unset it",
                    store::MAX_BYTES_ENV
                ),
            )
        }
    };
    let usable = entries
        .iter()
        .filter(|e| {
            Some(e.meta.image_hash.as_str()) == current_image
                && e.meta.voidbox_version == env!("CARGO_PKG_VERSION")
        })
        .count();
    let usable = match (current_image, usable) {
        (None, _) => "none usable until the guest image is built".to_string(),
        (Some(_), 0) => {
            "none of the current image yet: the first apply/run cold-boots once and snapshots it"
                .to_string()
        }
        (Some(_), n) => format!("{n} of the current image"),
    };
    let detail = format!(
        "{} snapshot(s), {} of a {cap} cap; {usable}",
        entries.len(),
        human_size(bytes)
    );
    if broken.is_empty() {
        Check::ok(SNAPSHOTS, detail)
    } else {
        let keys: Vec<String> = broken
            .iter()
            .filter_map(|(d, _)| d.file_name())
            .map(|n| n.to_string_lossy().chars().take(12).collect())
            .collect();
        Check::warn(
            SNAPSHOTS,
            format!("{detail}; {} unreadable", broken.len()),
            format!("`voidbox snapshot rm {}`", keys.join(" ")),
        )
    }
}

/// The verdict for `free` bytes in the cache root when building what is missing needs
/// `pending` bytes.
pub fn classify_disk(free: u64, pending: u64) -> Status {
    if free < FAIL_BELOW_BYTES || free < pending {
        Status::Fail
    } else if free < WARN_BELOW_BYTES {
        Status::Warn
    } else {
        Status::Ok
    }
}

/// The nearest existing directory at or above `p` (the cache root may not exist yet).
fn existing_ancestor(p: &Path) -> Option<&Path> {
    p.ancestors().find(|a| a.is_dir())
}

/// Free space on the cache root's filesystem; `pending`: what building the missing image
/// and runtimes disk needs.
pub fn disk_check(root: &Result<PathBuf, String>, pending: u64) -> Check {
    let root = match root {
        Ok(r) => r,
        Err(e) => return no_root(DISK, e),
    };
    let Some(dir) = existing_ancestor(root) else {
        return Check::fail(
            DISK,
            format!("no directory of {} exists", root.display()),
            "set HOME (or XDG_CACHE_HOME) to an existing directory",
        );
    };
    let st = match rustix::fs::statvfs(dir) {
        Ok(s) => s,
        Err(e) => {
            return Check::warn(
                DISK,
                format!("cannot read free space of {}: {e}", dir.display()),
                "check the filesystem holding the cache",
            )
        }
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let detail = format!("{} free for {}", human_size(free), root.display());
    let fix = "free space on that filesystem (`voidbox image rm`, `voidbox snapshot rm --all`, \
               `voidbox oci prune`), or point XDG_CACHE_HOME at a larger one";
    match classify_disk(free, pending) {
        Status::Ok => Check::ok(DISK, detail),
        Status::Warn => Check::warn(
            DISK,
            format!(
                "{detail}: under {}; image rebuilds, OCI disks and the snapshot cache (cap {}) may fill it",
                human_size(WARN_BELOW_BYTES),
                human_size(store::DEFAULT_MAX_BYTES)
            ),
            fix,
        ),
        Status::Fail if free >= FAIL_BELOW_BYTES => Check::fail(
            DISK,
            format!(
                "{detail}, but building the missing guest image / runtimes disk needs ≈{}",
                human_size(pending)
            ),
            fix,
        ),
        Status::Fail => Check::fail(
            DISK,
            format!(
                "{detail}: under {}, snapshots and VM disks will not fit",
                human_size(FAIL_BELOW_BYTES)
            ),
            fix,
        ),
    }
}
