//! Golden snapshots: every node still gets a fresh VM, but restored from a snapshot of a
//! guest that has already booted to "agent ready" instead of cold-booting.
//!
//! A golden snapshot is taken of a dedicated VM right after its first authenticated
//! handshake, before any request that could carry a secret ([`create`]). It is keyed by the
//! guest image (and its command line), memory size, vCPU count and device set, and cached in
//! [`store`]. Each node restores its own private copy (the VMM maps the memory file
//! copy-on-write) and rotates the session secret at once through an authenticated re-key
//! that also reseeds the guest RNG and sets its clock ([`crate::sandbox::Sandbox::rekey`]).

pub mod cli;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::image::manifest::content_hash;
use crate::sandbox::{
    image_key, GuestImage, RestoreFrom, Sandbox, SandboxConfig, SandboxError, VmmLauncher,
};
pub use store::{Entry, LockMode, Meta, Store, StoreError};

/// The VMM's device set, in bus order (part of the cache key; the VMM checks its own).
pub const DEVICES: &[&str] = &["serial", "i8042", "vsock"];
/// The device a VM with network has besides [`DEVICES`].
pub const NET_DEVICE: &str = "virtio-net";
/// The share slots a VM with host shares has besides [`DEVICES`].
pub const SHARE_SLOTS_DEVICE: &str = "virtio-9p-slots";
/// How long writing a snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a golden snapshot is taken of.
#[derive(Debug, Clone)]
pub struct GoldenSpec {
    /// Kernel + initramfs.
    pub image: GuestImage,
    /// Guest memory in MiB.
    pub memory_mb: u32,
    /// vCPUs.
    pub vcpus: u8,
    /// Extra kernel parameters.
    pub extra_cmdline: Vec<String>,
    /// Image disks and user.
    pub disks: crate::sandbox::disks::VmDisks,
    /// The network device: only whether there is one is part of the key. The creator VM
    /// gets this config with [`crate::network::creator_policy`] (deny everything); VMs
    /// restored from the snapshot bring their own policy.
    pub network: Option<voidbox_net::NatConfig>,
    /// The virtio-9p share slots (for VMs with host shares; the others boot without them).
    pub share_slots: bool,
}

impl GoldenSpec {
    /// The golden spec a VM with `cfg` restores from.
    pub fn of(cfg: &SandboxConfig) -> GoldenSpec {
        GoldenSpec {
            image: cfg.image.clone(),
            memory_mb: cfg.memory_mb,
            vcpus: cfg.vcpus,
            extra_cmdline: cfg.extra_cmdline.clone(),
            disks: cfg.disks.clone(),
            network: cfg.network.clone(),
            share_slots: cfg.needs_share_slots(),
        }
    }

    /// The devices of the VM, in bus order.
    pub fn devices(&self) -> Vec<&'static str> {
        let mut d = DEVICES.to_vec();
        if self.network.is_some() {
            d.push(NET_DEVICE);
        }
        if self.share_slots {
            d.push(SHARE_SLOTS_DEVICE);
        }
        d
    }

    /// The cache key: SHA-256 over everything the snapshot depends on.
    pub fn key(&self) -> String {
        let key = content_hash(&(
            "voidbox-golden-snapshot",
            env!("CARGO_PKG_VERSION"),
            voidbox_vmm::persist::format::FORMAT_VERSION,
            image_key(
                &self.image,
                &self.extra_cmdline,
                &self.disks,
                self.network.is_some(),
            ),
            self.memory_mb,
            self.vcpus,
            self.devices(),
        ));
        // What `warm_up` ran, i.e. what is in the snapshot's page cache (keys of VMs without
        // the runtimes disk stay what they were).
        if has_runtimes(&self.disks) {
            return content_hash(&(key, "warm-up: runtimes --version"));
        }
        key
    }
}

/// How a VM that will take a golden snapshot is started.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// How VMMs are started.
    pub launcher: VmmLauncher,
    /// Boot deadline.
    pub boot_timeout: Duration,
    /// Parent of the VM's temp dir.
    pub runtime_dir: Option<PathBuf>,
}

/// Boots a dedicated VM, authenticates once, snapshots it into a staging dir and installs
/// it as the entry for `spec` (call with the exclusive lock of the key held). The VM never
/// runs anything else and is killed afterwards.
pub fn create(
    store: &Store,
    spec: &GoldenSpec,
    opts: &CreateOptions,
) -> Result<Entry, SandboxError> {
    let key = spec.key();
    let staging = store.staging().map_err(env)?;
    let cfg = creator_config(spec, opts);
    let mut sb = Sandbox::start(&cfg)?;
    let boot = sb.timings().total;
    warm_up(&mut sb, &spec.disks);
    let stats = sb.snapshot_to(staging.path(), SNAPSHOT_TIMEOUT)?;
    let secret = sb.secret().clone();
    drop(sb);
    let meta = Meta {
        key: key.clone(),
        image_hash: spec.image.hash.clone(),
        image_key: image_key(
            &spec.image,
            &spec.extra_cmdline,
            &spec.disks,
            spec.network.is_some(),
        ),
        extra_cmdline: spec.extra_cmdline.clone(),
        network: spec.network.is_some(),
        memory_mb: spec.memory_mb,
        vcpus: spec.vcpus,
        created_unix: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        voidbox_version: env!("CARGO_PKG_VERSION").to_string(),
        boot_ms: boot.as_millis() as u64,
        snapshot_ms: stats.total.as_millis() as u64,
        pause_us: stats.pause.as_micros() as u64,
        state_bytes: stats.state_bytes,
        base: None,
        warm: None,
    };
    store::write_entry_files(staging.path(), &secret, &meta).map_err(env)?;
    store.install(staging, &key).map_err(env)
}

/// The settings of a VM that takes a snapshot of `spec`'s shape (a golden snapshot, or a
/// warm runtime's over one): its snapshot control on, and a NAT through which nothing reaches
/// it and it reaches nothing — none of the node's published ports or service sockets (the
/// restored VM's NAT binds those).
pub(crate) fn creator_config(spec: &GoldenSpec, opts: &CreateOptions) -> SandboxConfig {
    let mut cfg = SandboxConfig::new(spec.image.clone());
    cfg.memory_mb = spec.memory_mb;
    cfg.vcpus = spec.vcpus;
    cfg.extra_cmdline = spec.extra_cmdline.clone();
    cfg.disks = spec.disks.clone();
    cfg.share_slots = spec.share_slots;
    cfg.network = spec.network.clone().map(|mut n| {
        n.policy = crate::network::creator_policy();
        n.publish.clear();
        n.publish_unix.clear();
        n.services.clear();
        n
    });
    cfg.launcher = opts.launcher.clone();
    cfg.boot_timeout = opts.boot_timeout;
    cfg.runtime_dir = opts.runtime_dir.clone();
    cfg.snapshot_control = true;
    cfg
}

/// Runs one shell in the VM before it is snapshotted — and, with the runtimes disk attached,
/// each agent runtime once (`--version`). The guest's programs live on read-only disks and
/// are read into the guest's page cache when first run (busybox: ≈0.7 s; Claude Code: ≈45 s
/// of page faults where guest kernel code is interpreted, see BENCHMARKS.md); read once
/// here, they are in every VM restored from the snapshot. Best effort: the snapshot is
/// valid without it. Nothing is left behind (the runtimes get a scratch `HOME`).
fn warm_up(sb: &mut Sandbox, disks: &crate::sandbox::disks::VmDisks) {
    let mut script = "true".to_string();
    if has_runtimes(disks) {
        script = format!(
            "export HOME=/tmp/voidbox-warm-up CODEX_HOME=/tmp/voidbox-warm-up; mkdir -p $HOME; \
             {} --version >/dev/null 2>&1; {} --version >/dev/null 2>&1; rm -rf $HOME",
            crate::runtimes::CLAUDE_BIN,
            crate::runtimes::CODEX_BIN
        );
    }
    let req = voidbox_protocol::ExecRequest {
        program: "sh".into(),
        args: vec!["-c".into(), script],
        ..voidbox_protocol::ExecRequest::default()
    };
    let _ = sb.exec(req, &mut |_, _| {});
}

/// Whether the runtimes disk ([`crate::runtimes`]) is among `disks`.
fn has_runtimes(disks: &crate::sandbox::disks::VmDisks) -> bool {
    disks
        .images
        .iter()
        .any(|d| matches!(&d.role, crate::sandbox::disks::DiskRole::Runtimes { .. }))
}

pub(crate) fn env(e: StoreError) -> SandboxError {
    SandboxError::Environment(format!("snapshot cache: {e}"))
}

/// A snapshot a VM restores from, held (shared lock) so that nobody removes it meanwhile.
#[derive(Debug)]
pub struct Lease {
    /// The entry.
    pub entry: Entry,
    /// What the VM needs to restore.
    pub restore: RestoreFrom,
    /// Whether this is a golden (cache) snapshot, as opposed to one the spec named.
    pub golden: bool,
    _lock: Option<store::EntryLock>,
}

impl Lease {
    /// A lease on `entry`, holding `lock` (its shared lock) for as long as it lives.
    pub(crate) fn held(
        entry: Entry,
        restore: RestoreFrom,
        golden: bool,
        lock: store::EntryLock,
    ) -> Lease {
        Lease {
            entry,
            restore,
            golden,
            _lock: Some(lock),
        }
    }
}

/// The golden snapshot for `spec`, created first if the cache has none. `notice` receives
/// one line when a snapshot is created or a broken one is replaced.
pub fn ensure_golden(
    store: &Store,
    spec: &GoldenSpec,
    opts: &CreateOptions,
    max_bytes: u64,
    notice: &dyn Fn(&str),
) -> Result<Lease, SandboxError> {
    ensure_golden_until(store, spec, opts, max_bytes, notice, &|| false)
}

/// How often a wait for another creator's lock checks for cancellation.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// Takes the lock of `key`, waiting for a conflicting holder (another VM creating the
/// snapshot) until `cancelled` says to give up; a wait is told to `notice` once, naming the
/// snapshot and the holder.
pub(crate) fn lock_until(
    store: &Store,
    key: &str,
    mode: LockMode,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<store::EntryLock, SandboxError> {
    let mut told = false;
    loop {
        if let Some(l) = store.lock(key, mode, false).map_err(env)? {
            if mode == LockMode::Exclusive {
                l.record_holder();
            }
            return Ok(l);
        }
        wait_once_more(store, key, &mut told, notice, cancelled)?;
    }
}

/// One round of waiting for `key`'s holder: tells `notice` the first time (`told`), unless
/// the holder is this process (its "creating …" notice says it), then sleeps [`LOCK_POLL`];
/// an error once `cancelled`.
fn wait_once_more(
    store: &Store,
    key: &str,
    told: &mut bool,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<(), SandboxError> {
    if !*told {
        *told = true;
        let holder = store.lock_holder(key);
        if holder
            .as_ref()
            .is_none_or(|(pid, _)| *pid != std::process::id())
        {
            notice(&waiting_for(key, holder));
        }
    }
    if cancelled() {
        return Err(SandboxError::Cancelled(
            "while waiting for a snapshot another VM creates".into(),
        ));
    }
    std::thread::sleep(LOCK_POLL);
    Ok(())
}

/// The exclusive lock to create `key`, or `None` once another creator has installed it
/// meanwhile (lease it then: VMs restoring from it hold its shared lock for as long as they
/// start, or — a warm snapshot's base — for as long as the warm runtime starts, so waiting
/// for the exclusive lock would wait for all of them).
pub(crate) fn create_lock_until(
    store: &Store,
    key: &str,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<Option<store::EntryLock>, SandboxError> {
    let mut told = false;
    loop {
        if let Some(l) = store.lock(key, LockMode::Exclusive, false).map_err(env)? {
            l.record_holder();
            return Ok(Some(l));
        }
        if matches!(store.get(key), Ok(Some(_))) {
            return Ok(None);
        }
        wait_once_more(store, key, &mut told, notice, cancelled)?;
    }
}

/// [`ensure_golden`], giving up with [`SandboxError::Cancelled`] once `cancelled` is true.
pub fn ensure_golden_until(
    store: &Store,
    spec: &GoldenSpec,
    opts: &CreateOptions,
    max_bytes: u64,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<Lease, SandboxError> {
    let key = spec.key();
    for _ in 0..3 {
        if let Some(lease) = lease_existing(store, &key, notice, cancelled)? {
            return Ok(lease);
        }
        // Create it, unless a concurrent creator (this or another process) did meanwhile.
        let Some(_x) = create_lock_until(store, &key, notice, cancelled)? else {
            continue;
        };
        if matches!(store.get(&key), Ok(Some(_))) {
            continue;
        }
        notice(&format!(
            "creating the golden snapshot {} ({} MiB, {} vCPU{}): one cold boot, then every VM restores from it",
            &key[..12],
            spec.memory_mb,
            spec.vcpus,
            if spec.network.is_some() { ", network device" } else { "" }
        ));
        let entry = create(store, spec, opts)?;
        for gone in store.evict(max_bytes, &key) {
            notice(&format!(
                "evicted the least recently used snapshot {} (cache over its size cap)",
                &gone[..12]
            ));
        }
        drop(entry);
    }
    Err(SandboxError::Environment(format!(
        "snapshot cache: the golden snapshot {} keeps disappearing (removed concurrently?)",
        &key[..12]
    )))
}

/// What a VM waiting for `key`'s lock is waiting for: `holder` is the process that took it
/// last ([`Store::lock_holder`]).
fn waiting_for(key: &str, holder: Option<(u32, Option<String>)>) -> String {
    let who = match holder {
        Some((pid, Some(cmd))) => format!("process {pid} ({cmd})"),
        Some((pid, None)) => format!("process {pid}"),
        None => "another process".to_string(),
    };
    format!(
        "waiting for snapshot {}: {who} holds its lock while it creates it (a golden snapshot: a cold boot, usually 10-30 s; a warm runtime: the runtime's start)",
        &key[..12.min(key.len())]
    )
}

/// A shared lease on an existing, readable entry; a broken entry is removed (with a notice)
/// and reported as absent.
fn lease_existing(
    store: &Store,
    key: &str,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<Option<Lease>, SandboxError> {
    let lock = Some(lock_until(store, key, LockMode::Shared, notice, cancelled)?);
    match store.get(key) {
        Ok(Some(entry)) => match entry.restore_from() {
            Ok(restore) => {
                store.touch(key);
                Ok(Some(Lease {
                    entry,
                    restore,
                    golden: true,
                    _lock: lock,
                }))
            }
            Err(e) => {
                drop(lock);
                discard_broken(store, key, &e.to_string(), notice);
                Ok(None)
            }
        },
        Ok(None) => Ok(None),
        Err(e) => {
            drop(lock);
            discard_broken(store, key, &e.to_string(), notice);
            Ok(None)
        }
    }
}

/// Removes a golden snapshot that cannot serve, with a one-line notice.
pub fn discard_broken(store: &Store, key: &str, why: &str, notice: &dyn Fn(&str)) {
    let first = why.lines().next().unwrap_or(why);
    notice(&format!(
        "snapshot {} cannot be used ({first}); removing it",
        &key[..key.len().min(12)]
    ));
    // Diffs over a broken base cannot serve either. (One in use stays: its VM holds it.)
    let _ = store.remove_with_dependents(key);
}

/// Resolves a spec's `sandbox.snapshot` (a cache key prefix or a directory, relative to
/// `base`) and checks that it fits a VM with `cfg`.
pub fn explicit(
    store: &Store,
    value: &str,
    base: &Path,
    cfg: &SandboxConfig,
) -> Result<Lease, SandboxError> {
    let looks_like_dir = value.contains('/') || value.starts_with('.') || base.join(value).is_dir();
    let (entry, lock) = if looks_like_dir {
        let dir = base.join(value);
        let entry = Entry::load(&dir)
            .map_err(|e| SandboxError::Environment(format!("sandbox.snapshot `{value}`: {e}")))?;
        (entry, None)
    } else {
        let key = store
            .resolve(value)
            .map_err(|e| SandboxError::Environment(format!("sandbox.snapshot `{value}`: {e}")))?;
        let lock = store.lock(&key, LockMode::Shared, true).map_err(env)?;
        let entry = store
            .get(&key)
            .map_err(|e| SandboxError::Environment(format!("sandbox.snapshot `{value}`: {e}")))?
            .ok_or_else(|| {
                SandboxError::Environment(format!("sandbox.snapshot `{value}`: it was removed"))
            })?;
        store.touch(&key);
        (entry, lock)
    };
    let m = &entry.meta;
    let want_image = image_key(
        &cfg.image,
        &cfg.extra_cmdline,
        &cfg.disks,
        cfg.network.is_some(),
    );
    let mismatch = if m.memory_mb != cfg.memory_mb {
        Some(format!(
            "it was taken with memory_mb {}, the node asks for {}",
            m.memory_mb, cfg.memory_mb
        ))
    } else if m.vcpus != cfg.vcpus {
        Some(format!(
            "it was taken with {} vCPU(s), the node asks for {}",
            m.vcpus, cfg.vcpus
        ))
    } else if m.network != cfg.network.is_some() {
        Some(if m.network {
            "it was taken of a VM with a network device, the node has `network: false`".to_string()
        } else {
            "it was taken of a VM without a network device, the node has `network:`".to_string()
        })
    } else if m.image_key != want_image {
        Some(format!(
            "it was taken of guest image {}, this run boots image {}",
            short(&m.image_hash),
            short(&cfg.image.hash)
        ))
    } else {
        None
    };
    if let Some(why) = mismatch {
        return Err(SandboxError::Environment(format!(
            "sandbox.snapshot `{value}` cannot restore this node: {why}\n  help: create a matching one with `voidbox snapshot create --memory-mb {} --vcpus {}{}`, or remove `snapshot:`",
            cfg.memory_mb,
            cfg.vcpus,
            if cfg.network.is_some() { " --network" } else { "" }
        )));
    }
    let restore = entry
        .restore_from()
        .map_err(|e| SandboxError::Environment(format!("sandbox.snapshot `{value}`: {e}")))?;
    Ok(Lease {
        entry,
        restore,
        golden: false,
        _lock: lock,
    })
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

/// The snapshot policy of a run.
#[derive(Clone)]
pub struct Snapshots {
    /// The cache; `None` disables snapshots (`--no-snapshot`): every VM cold-boots.
    pub store: Option<Store>,
    /// How golden snapshot VMs are started.
    pub create: CreateOptions,
    /// Cache size cap.
    pub max_bytes: u64,
    /// Base directory of relative `sandbox.snapshot` paths (the spec's directory).
    pub base: PathBuf,
    /// One-line notices (snapshot created, broken snapshot replaced, cold-boot fallback).
    pub notice: Arc<dyn Fn(&str) + Send + Sync>,
}

impl Snapshots {
    /// The policy of a run: golden snapshots from the default cache when `enabled`, else
    /// cold boots. A cache that cannot be opened disables snapshots with a notice; a bad
    /// size cap ([`store::MAX_BYTES_ENV`]) is an error.
    pub fn new(
        enabled: bool,
        create: CreateOptions,
        base: PathBuf,
        notice: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> Result<Snapshots, String> {
        let max_bytes = store::max_bytes()?;
        let store = if enabled {
            match Store::open(None) {
                // An unwritable cache would fail every VM's lock: say so once, with the fix.
                Ok(s) => match store::write_problem(s.root()) {
                    None => Some(s),
                    Some((why, fix)) => {
                        notice(&format!(
                            "warning: snapshots disabled: {why}; every VM boots cold (several times slower)\n  help: {fix}"
                        ));
                        None
                    }
                },
                Err(e) => {
                    notice(&format!("snapshots disabled ({e}); every VM boots cold"));
                    None
                }
            }
        } else {
            None
        };
        Ok(Snapshots {
            store,
            create,
            max_bytes,
            base,
            notice,
        })
    }

    /// Decides how a VM with `cfg` starts: sets `cfg.restore` and returns the lease to hold
    /// while the VM starts. A spec-named snapshot that cannot serve is an error; a golden
    /// snapshot that cannot be created means a cold boot, with a notice.
    pub fn prepare(
        &self,
        cfg: &mut SandboxConfig,
        named: Option<&str>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Option<Lease>, SandboxError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let lease = match named {
            Some(v) => explicit(store, v, &self.base, cfg)?,
            None => {
                let spec = GoldenSpec::of(cfg);
                match ensure_golden_until(
                    store,
                    &spec,
                    &self.create,
                    self.max_bytes,
                    &*self.notice,
                    cancelled,
                ) {
                    Ok(l) => l,
                    Err(e) if cancelled() => return Err(e),
                    Err(e @ SandboxError::Cancelled(_)) => return Err(e),
                    Err(e) => {
                        let e = e.to_string();
                        (self.notice)(&format!(
                            "no snapshot can serve this VM ({}); booting cold",
                            e.lines().next().unwrap_or(&e)
                        ));
                        return Ok(None);
                    }
                }
            }
        };
        cfg.restore = Some(lease.restore.clone());
        Ok(Some(lease))
    }

    /// Starts a VM per `cfg` (restoring per [`Snapshots::prepare`]). A golden snapshot the
    /// VMM refuses is removed and the VM cold-boots, with a notice. `cancelled` ends waits
    /// for another creator of the golden snapshot (and rules out the cold-boot fallback).
    pub fn start(
        &self,
        cfg: &SandboxConfig,
        named: Option<&str>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Sandbox, SandboxError> {
        let mut cfg = cfg.clone();
        let lease = self.prepare(&mut cfg, named, cancelled)?;
        match Sandbox::start(&cfg) {
            Err(SandboxError::SnapshotRefused(why)) if lease.as_ref().is_some_and(|l| l.golden) => {
                let key = lease.map(|l| l.entry.meta.key.clone()).unwrap_or_default();
                if let Some(store) = &self.store {
                    discard_broken(store, &key, &why, &*self.notice);
                }
                (self.notice)("booting this VM cold");
                cfg.restore = None;
                Sandbox::start(&cfg)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Profile;

    fn spec(mem: u32) -> GoldenSpec {
        GoldenSpec {
            image: GuestImage {
                hash: "a".repeat(64),
                vmlinux: "/k".into(),
                system_disk: "/d".into(),
                system_disk_sha256: "d".repeat(64),
                agent: "/a".into(),
                initramfs: None,
                profile: Profile::Compat,
                cmdline: "quiet".into(),
            },
            memory_mb: mem,
            vcpus: 1,
            extra_cmdline: vec![],
            disks: Default::default(),
            network: None,
            share_slots: false,
        }
    }

    #[test]
    fn key_depends_on_everything_the_snapshot_depends_on() {
        let a = spec(128);
        assert_eq!(a.key(), spec(128).key());
        assert_eq!(a.key().len(), 64);
        assert_ne!(a.key(), spec(256).key());
        let mut b = spec(128);
        b.vcpus = 2;
        assert_ne!(a.key(), b.key());
        let mut c = spec(128);
        c.image.hash = "b".repeat(64);
        assert_ne!(a.key(), c.key());
        let mut d = spec(128);
        d.extra_cmdline = vec!["x=1".into()];
        assert_ne!(a.key(), d.key());
        // Paths of the same image do not matter (the cache may move).
        let mut e = spec(128);
        e.image.vmlinux = "/elsewhere".into();
        assert_eq!(a.key(), e.key());
        // VMs with shares restore from a snapshot with the share slots, the others not.
        let mut f = spec(128);
        f.share_slots = true;
        assert_ne!(a.key(), f.key());
        assert_eq!(f.devices().last(), Some(&SHARE_SLOTS_DEVICE));
    }

    #[test]
    fn the_key_has_the_device_set_but_not_the_policy() {
        let plain = spec(128);
        // Keys of VMs without network are what they were before networking.
        let old_key = content_hash(&(
            "voidbox-golden-snapshot",
            env!("CARGO_PKG_VERSION"),
            voidbox_vmm::persist::format::FORMAT_VERSION,
            image_key(&plain.image, &[], &plain.disks, false),
            128u32,
            1u8,
            DEVICES,
        ));
        assert_eq!(plain.key(), old_key);
        let with = |policy: voidbox_net::NetworkPolicy| {
            let mut s = spec(128);
            s.network = Some(crate::network::nat_config(policy, &[]));
            s
        };
        let default = with(voidbox_net::NetworkPolicy::default());
        assert_ne!(default.key(), plain.key());
        assert_eq!(
            default.devices(),
            ["serial", "i8042", "vsock", "virtio-net"]
        );
        let strict = with(voidbox_net::NetworkPolicy {
            allow_host_ports: vec![11434],
            allow_domains: vec!["api.github.com".into()],
            deny: vec!["198.51.100.0/24".parse().unwrap()],
            max_connections: 4,
            ..voidbox_net::NetworkPolicy::default()
        });
        assert_eq!(strict.key(), default.key());
        let mut upstreams = with(voidbox_net::NetworkPolicy::default());
        upstreams.network = Some(crate::network::nat_config(
            voidbox_net::NetworkPolicy::default(),
            &["127.0.0.1:5353".parse().unwrap()],
        ));
        assert_eq!(upstreams.key(), default.key());
        // The VMM's own check (the image key it is given) tells them apart too.
        assert_ne!(
            image_key(&plain.image, &[], &plain.disks, true),
            image_key(&plain.image, &[], &plain.disks, false)
        );
    }

    /// A store in `dir` holding one installed entry (256 MiB, no network, secret `[1; 32]`)
    /// of [`spec`]`(256)`.
    fn installed_entry(dir: &Path) -> (Store, GoldenSpec) {
        let store = Store::open(Some(dir)).unwrap();
        let s = spec(256);
        let st = store.staging().unwrap();
        std::fs::write(st.path().join("state.snap"), b"s").unwrap();
        std::fs::write(st.path().join("memory.bin"), b"m").unwrap();
        let meta = Meta {
            key: s.key(),
            image_hash: s.image.hash.clone(),
            image_key: image_key(&s.image, &[], &s.disks, false),
            extra_cmdline: vec![],
            network: false,
            memory_mb: 256,
            vcpus: 1,
            created_unix: 0,
            voidbox_version: "0".into(),
            boot_ms: 0,
            snapshot_ms: 0,
            pause_us: 0,
            state_bytes: 0,
            base: None,
            warm: None,
        };
        let secret = voidbox_protocol::SessionSecret::from_bytes([1; 32]);
        store::write_entry_files(st.path(), &secret, &meta).unwrap();
        store.install(st, &s.key()).unwrap();
        (store, s)
    }

    #[test]
    fn a_named_snapshot_without_network_does_not_restore_a_network_node() {
        let d = tempfile::tempdir().unwrap();
        let (store, s) = installed_entry(d.path());
        // The meta file of an entry without network is what it was before networking.
        let text = std::fs::read_to_string(store.entry_dir(&s.key()).join("meta.json")).unwrap();
        assert!(!text.contains("network"), "{text}");
        let mut cfg = SandboxConfig::new(s.image.clone());
        cfg.memory_mb = 256;
        cfg.network = Some(crate::network::nat_config(
            voidbox_net::NetworkPolicy::default(),
            &[],
        ));
        let e = explicit(&store, &s.key()[..10], Path::new("/"), &cfg).unwrap_err();
        assert!(e.to_string().contains("without a network device"), "{e}");
        assert!(e.to_string().contains("--network"), "{e}");
        cfg.network = None;
        assert!(explicit(&store, &s.key()[..10], Path::new("/"), &cfg).is_ok());
    }

    #[test]
    fn a_named_snapshot_that_does_not_fit_is_refused_with_help() {
        let d = tempfile::tempdir().unwrap();
        let (store, s) = installed_entry(d.path());
        let mut cfg = SandboxConfig::new(s.image.clone());
        cfg.memory_mb = 128;
        let e = explicit(&store, &s.key()[..10], Path::new("/"), &cfg).unwrap_err();
        assert!(e.to_string().contains("memory_mb 256"), "{e}");
        assert!(e.to_string().contains("voidbox snapshot create"), "{e}");
        cfg.memory_mb = 256;
        let lease = explicit(&store, &s.key()[..10], Path::new("/"), &cfg).unwrap();
        assert_eq!(
            lease.restore.secret,
            voidbox_protocol::SessionSecret::from_bytes([1; 32])
        );
        assert!(!lease.golden);
        // By directory too.
        let dir = store.entry_dir(&s.key());
        let lease = explicit(&store, dir.to_str().unwrap(), Path::new("/"), &cfg).unwrap();
        assert_eq!(lease.entry.meta.key, s.key());
        let e = explicit(&store, "./nope", d.path(), &cfg).unwrap_err();
        assert!(e.to_string().contains("meta.json"), "{e}");
        let e = explicit(&store, "ffff", d.path(), &cfg).unwrap_err();
        assert!(e.to_string().contains("no cached snapshot"), "{e}");
    }
}
