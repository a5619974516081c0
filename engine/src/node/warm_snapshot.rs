//! Warm-runtime snapshots: an agent node restores a VM whose runtime is already running and
//! blocked on its input, and only its prompt is written to it.
//!
//! A warm snapshot is made once per configuration ([`WarmSpec::key`]) from the base golden
//! snapshot of the same VM shape: the creator restores the base, writes the runtime's
//! configuration and the node's kit, starts the runtime as a *held* exec (it outlives its
//! connection, [`crate::sandbox::Sandbox::exec_hold`]), waits until it has settled (nearly
//! idle for [`SETTLE_QUIET`]) and snapshots only the pages written since the base
//! ([`crate::sandbox::Sandbox::snapshot_diff_to`]). Every node of that configuration then
//! restores the diff over the base, gets a fresh session secret, RNG seed and clock (the
//! re-key), its own credential gateway, and attaches to the waiting runtime with its prompt.
//!
//! The runtime reaches its gateway at a fixed guest address ([`GATEWAY_ADDR`]:[`GATEWAY_PORT`],
//! a NAT route to the gateway's Unix socket in the VM's private directory) with the
//! placeholder token baked into the snapshot ([`TOKEN_FILE`]): each clone's gateway accepts
//! that token, and only that clone's NAT can reach that gateway.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use voidbox_protocol::{ExecRequest, GuestPolicy, OutputStream};

use crate::image::manifest::content_hash;
use crate::node::agent::GuestFile;
use crate::node::warm_launch::WarmLaunch;
use crate::providers::Secret;
use crate::sandbox::{image_key, Sandbox, SandboxError};
use crate::snapshot::{ensure_golden_until, env, CreateOptions, GoldenSpec, Lease, Store};

/// The held runtime's name in the guest.
pub const HELD: &str = crate::node::warm_launch::HELD_NAME;
/// The guest address of the gateway route (outside the guest's network, like the services').
pub const GATEWAY_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 3, 254);
/// The guest port of the gateway route.
pub const GATEWAY_PORT: u16 = 80;
/// The name the gateway route resolves under in the guest.
pub const GATEWAY_NAME: &str = "gateway.voidbox.internal";
/// The entry file holding the placeholder token baked into the runtime (mode 0600).
pub const TOKEN_FILE: &str = "gateway-token";
/// Time between the creator's checks that the runtime has settled.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// How long the runtime must be (nearly) idle to count as settled (waiting for its input).
pub const SETTLE_QUIET: Duration = Duration::from_secs(3);
/// The share of one CPU a settled runtime may still use (its timers and housekeeping, which
/// cost far more where guest system calls are interpreted).
pub const SETTLE_CPU_SHARE: f64 = 0.25;
/// The longest the creator waits for the runtime to settle (a runtime start in a
/// software-KVM guest takes minutes) before snapshotting it as it is.
pub const SETTLE_MAX: Duration = Duration::from_secs(600);
/// How long writing the snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Why `node`'s agent runtime (`runtime`) cannot start warm, or `None` when it can;
/// `snapshots`: the run uses snapshots at all (not `--no-snapshot`).
pub fn cold_reason(
    node: &crate::plan::PlanNode,
    runtime: crate::providers::Runtime,
    snapshots: bool,
) -> Option<String> {
    use crate::spec::model::AgentMode;
    let crate::plan::Action::Agent(a) = &node.action else {
        return None;
    };
    if !snapshots {
        return Some(
            "snapshots are off (`--no-snapshot`, or the snapshot cache cannot be used)".into(),
        );
    }
    if runtime == crate::providers::Runtime::Mock {
        return Some(crate::node::warm_launch::MOCK_COLD.into());
    }
    if a.mode == AgentMode::Interactive {
        return Some(crate::node::warm_launch::INTERACTIVE_COLD.into());
    }
    if node.sandbox.snapshot.is_some() {
        return Some("`sandbox.snapshot` names the snapshot its VM restores".into());
    }
    if !node.sandbox.mounts.is_empty() {
        return Some("`sandbox.mounts` are attached after the restore, so a runtime already running would not see them".into());
    }
    None
}

/// The base URL a warm runtime's configuration names (plus the upstream's path).
pub fn gateway_base_url(guest_path: &str) -> String {
    format!("http://{GATEWAY_ADDR}:{GATEWAY_PORT}{guest_path}")
}

/// The NAT route that takes a warm runtime's gateway connections to `socket`.
pub fn gateway_route(socket: &Path) -> voidbox_net::ServiceRoute {
    voidbox_net::ServiceRoute {
        name: GATEWAY_NAME.into(),
        addr: GATEWAY_ADDR,
        ports: vec![voidbox_net::ServicePort {
            port: GATEWAY_PORT,
            to: voidbox_net::PortTarget::Unix(socket.to_path_buf()),
        }],
    }
}

/// What a warm snapshot is taken of.
#[derive(Debug, Clone)]
pub struct WarmSpec {
    /// The base: the VM shape (image, disks, memory, vCPUs, devices).
    pub golden: GoldenSpec,
    /// The held runtime and its configuration files (the token in its environment is
    /// [`TOKEN_MARK`] until [`create`] mints the real one).
    pub launch: WarmLaunch,
    /// The node's kit as guest files.
    pub kit: Vec<GuestFile>,
    /// The guest policy in force when the runtime started (allowlist, rlimits).
    pub policy: Option<GuestPolicy>,
    /// The node's network policy.
    pub network: Option<voidbox_net::NetworkPolicy>,
    /// The provider's name (report and metadata).
    pub provider: String,
    /// The model.
    pub model: Option<String>,
}

/// What stands for the gateway token in a [`WarmSpec`]'s launch (the key does not depend on
/// the token [`create`] mints).
pub const TOKEN_MARK: &str = "vbx-warm-token-placeholder";

impl WarmSpec {
    /// The cache key: SHA-256 over everything the waiting runtime has read or been given.
    pub fn key(&self) -> String {
        let r = &self.launch.request;
        let files = |fs: &[GuestFile]| -> Vec<(String, u32, String)> {
            fs.iter()
                .map(|f| (f.path.clone(), f.mode, content_hash(&f.data)))
                .collect()
        };
        content_hash(&(
            "voidbox-warm-runtime",
            1u32,
            self.golden.key(),
            (&r.program, &r.args, &r.env, &r.workdir),
            files(&self.launch.files),
            files(&self.kit),
            serde_json::to_string(&self.policy).unwrap_or_default(),
            serde_json::to_string(&self.network).unwrap_or_default(),
            (&self.provider, &self.model),
        ))
    }

    /// The content hash of the kit (the report's and `snapshot ls`'s).
    pub fn kit_hash(&self) -> String {
        content_hash(
            &self
                .kit
                .iter()
                .map(|f| (f.path.clone(), content_hash(&f.data)))
                .collect::<Vec<_>>(),
        )
    }

    /// The runtime's name.
    pub fn runtime(&self) -> &'static str {
        crate::node::launch::runtime_name(self.launch.runtime)
    }
}

/// A warm snapshot a VM restores from: the lease (holding the entry and its base) and the
/// placeholder token its gateway must accept.
#[derive(Debug)]
pub struct WarmLease {
    /// The entry, its restore source (with the base) and lock.
    pub lease: Lease,
    /// The placeholder token baked into the runtime.
    pub token: Secret,
    /// Whether this call created the snapshot.
    pub created: bool,
}

/// The warm snapshot of `spec`, created first (from its base golden snapshot, created too if
/// missing) when the cache has none.
pub fn ensure_warm(
    store: &Store,
    spec: &WarmSpec,
    opts: &CreateOptions,
    max_bytes: u64,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<WarmLease, SandboxError> {
    let key = spec.key();
    let mut created = false;
    for _ in 0..3 {
        if let Some(l) = lease_warm(store, &key, notice, cancelled)? {
            return Ok(WarmLease { created, ..l });
        }
        let Some(_x) = crate::snapshot::create_lock_until(store, &key, notice, cancelled)? else {
            continue;
        };
        if matches!(store.get(&key), Ok(Some(_))) {
            continue;
        }
        notice(&format!(
            "creating the warm {} snapshot {} ({} MiB): the runtime starts once, then every node of this configuration restores it waiting for its prompt",
            spec.runtime(),
            &key[..12],
            spec.golden.memory_mb,
        ));
        create(store, spec, &key, opts, max_bytes, notice, cancelled)?;
        created = true;
        for gone in store.evict(max_bytes, &key) {
            notice(&format!(
                "evicted the least recently used snapshot {} (cache over its size cap)",
                &gone[..12]
            ));
        }
    }
    Err(SandboxError::Environment(format!(
        "snapshot cache: the warm snapshot {} keeps disappearing (removed concurrently?)",
        &key[..12]
    )))
}

/// A shared lease on an existing warm entry and its base; a broken one is removed.
fn lease_warm(
    store: &Store,
    key: &str,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<Option<WarmLease>, SandboxError> {
    let lock = crate::snapshot::lock_until(
        store,
        key,
        crate::snapshot::LockMode::Shared,
        notice,
        cancelled,
    )?;
    let entry = match store.get(key) {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(None),
        Err(e) => {
            drop(lock);
            crate::snapshot::discard_broken(store, key, &e.to_string(), notice);
            return Ok(None);
        }
    };
    // (The entry's shared lock holds its base's too: the base stays while the diff is
    // restored from it.)
    let Some(base) = entry.meta.base.clone() else {
        drop(lock);
        crate::snapshot::discard_broken(store, key, "it has no base snapshot", notice);
        return Ok(None);
    };
    let ready = entry
        .restore_from()
        .map_err(|e| e.to_string())
        .and_then(|r| read_token(&entry.dir).map(|t| (r, t)));
    match ready {
        Ok((restore, token)) => {
            store.touch(key);
            store.touch(&base);
            Ok(Some(WarmLease {
                lease: Lease::held(entry, restore, true, lock),
                token,
                created: false,
            }))
        }
        Err(why) => {
            drop(lock);
            crate::snapshot::discard_broken(store, key, &why, notice);
            Ok(None)
        }
    }
}

/// The placeholder token of a warm entry.
fn read_token(dir: &Path) -> Result<Secret, String> {
    let path = dir.join(TOKEN_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{TOKEN_FILE}: {e}"))?;
    let t = text.trim();
    let ok =
        t.len() == 52 && t.starts_with("vbx-") && t[4..].bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return Err(format!("{TOKEN_FILE}: not a gateway token"));
    }
    Ok(Secret::new(t.to_string()))
}

/// A fresh placeholder token (`vbx-` and 192 random bits in hex, as the gateway mints).
fn new_token() -> Result<String, SandboxError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)
        .map_err(|e| SandboxError::Environment(format!("no randomness for the token: {e}")))?;
    Ok(format!("vbx-{}", hex::encode(bytes)))
}

/// Creates the warm entry of `spec` under `key` (its [`WarmSpec::key`]; call with its
/// exclusive lock held): restores the base, starts the runtime, waits for it to settle,
/// snapshots the diff.
fn create(
    store: &Store,
    spec: &WarmSpec,
    key: &str,
    opts: &CreateOptions,
    max_bytes: u64,
    notice: &dyn Fn(&str),
    cancelled: &dyn Fn() -> bool,
) -> Result<(), SandboxError> {
    let base = ensure_golden_until(store, &spec.golden, opts, max_bytes, notice, cancelled)?;
    let token = new_token()?;
    // The creator reaches nothing: the runtime makes no request before its prompt.
    let mut cfg = crate::snapshot::creator_config(&spec.golden, opts);
    cfg.policy = spec.policy.clone();
    cfg.restore = Some(base.restore.clone());
    let t0 = Instant::now();
    let mut sb = Sandbox::start(&cfg)?;
    for f in spec.launch.files.iter().chain(&spec.kit) {
        sb.write_file(&f.path, &f.data, Some(f.mode))?;
    }
    let mut req = spec.launch.request.clone();
    for (_, v) in req.env.iter_mut() {
        if v == TOKEN_MARK {
            *v = token.clone();
        }
    }
    sb.exec_hold(HELD, req)?;
    let settle = settle(&mut sb, cancelled, notice)?;
    let staging = store.staging().map_err(env)?;
    let stats = sb.snapshot_diff_to(staging.path(), &base.entry.dir, SNAPSHOT_TIMEOUT)?;
    let secret = sb.secret().clone();
    drop(sb);
    let meta = crate::snapshot::Meta {
        key: key.to_string(),
        image_hash: spec.golden.image.hash.clone(),
        image_key: image_key(
            &spec.golden.image,
            &spec.golden.extra_cmdline,
            &spec.golden.disks,
            spec.golden.network.is_some(),
        ),
        extra_cmdline: spec.golden.extra_cmdline.clone(),
        network: spec.golden.network.is_some(),
        memory_mb: spec.golden.memory_mb,
        vcpus: spec.golden.vcpus,
        created_unix: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        voidbox_version: env!("CARGO_PKG_VERSION").to_string(),
        boot_ms: t0.elapsed().as_millis() as u64,
        snapshot_ms: stats.total.as_millis() as u64,
        pause_us: stats.pause.as_micros() as u64,
        state_bytes: stats.state_bytes,
        base: Some(base.entry.meta.key.clone()),
        warm: Some(crate::snapshot::store::WarmMeta {
            runtime: spec.runtime().to_string(),
            provider: spec.provider.clone(),
            model: spec.model.clone(),
            kit_hash: spec.kit_hash(),
            settle_ms: settle.as_millis() as u64,
            diff_bytes: stats.disk_bytes,
        }),
    };
    crate::snapshot::store::write_entry_files(staging.path(), &secret, &meta).map_err(env)?;
    write_token(staging.path(), &token)?;
    drop(base);
    store.install(staging, key).map_err(env)?;
    Ok(())
}

/// Writes the token file (mode 0600).
fn write_token(dir: &Path, token: &str) -> Result<(), SandboxError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(TOKEN_FILE);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(token.as_bytes()))
        .map_err(|e| SandboxError::Environment(format!("{}: {e}", path.display())))
}

/// Waits until the held runtime has settled — over the last [`SETTLE_QUIET`] it used at
/// most [`SETTLE_CPU_SHARE`] of one CPU: loaded, configured and waiting for its input (its
/// timers and housekeeping still cost a little) — or until [`SETTLE_MAX`], when it is
/// snapshotted as it is, with a notice: a runtime that has not consumed any input is a valid
/// snapshot at any point, and its clones carry on from there. A runtime that exits instead
/// is an error carrying what it printed.
fn settle(
    sb: &mut Sandbox,
    cancelled: &dyn Fn() -> bool,
    notice: &dyn Fn(&str),
) -> Result<Duration, SandboxError> {
    let t0 = Instant::now();
    // (time, cpu_ms) per check, the last SETTLE_QUIET of them.
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    loop {
        if cancelled() {
            return Err(SandboxError::Cancelled(
                "while the warm runtime started".into(),
            ));
        }
        let info = sb.held_info(HELD)?;
        if info.exited {
            return Err(SandboxError::Environment(exited_early(sb)));
        }
        let now = Instant::now();
        window.push_back((now, info.cpu_ms));
        while window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > SETTLE_QUIET)
        {
            window.pop_front();
        }
        if let Some(&(first, cpu0)) = window.front() {
            let span = now.duration_since(first);
            let used = Duration::from_millis(info.cpu_ms.saturating_sub(cpu0));
            if span + SETTLE_POLL >= SETTLE_QUIET
                && used.as_secs_f64() <= span.as_secs_f64() * SETTLE_CPU_SHARE
            {
                return Ok(first.duration_since(t0));
            }
        }
        if t0.elapsed() > SETTLE_MAX {
            notice(&format!(
                "the warm runtime was still busy after {} s ({} ms of CPU); snapshotting it as it is",
                SETTLE_MAX.as_secs(),
                info.cpu_ms
            ));
            return Ok(t0.elapsed());
        }
        std::thread::sleep(SETTLE_POLL);
    }
}

/// Why a held runtime exited before its prompt: its status and the tail of what it printed.
fn exited_early(sb: &mut Sandbox) -> String {
    let mut out = crate::capped::Tail::new(4096);
    let mut on = |_: OutputStream, d: &[u8]| {
        out.push(d);
        crate::sandbox::guest::Attach::Continue
    };
    let how = match sb.exec_attach(HELD, Vec::new(), Some(10), &mut on, None) {
        Ok(crate::sandbox::guest::Attached::Exited(r)) => {
            crate::scheduler::exit_words(r.exit_code, r.signal).unwrap_or_else(|| "exited".into())
        }
        Ok(_) => "exited".into(),
        Err(e) => format!("exited ({e})"),
    };
    let text = out.text();
    let tail = text.trim();
    if tail.is_empty() {
        format!("the agent runtime {how} before its prompt, printing nothing")
    } else {
        format!("the agent runtime {how} before its prompt:\n{tail}")
    }
}

/// The variables that differ per node, which a warm runtime (shared by every node of its
/// configuration) cannot have in its environment.
pub const PER_NODE_VARS: &[&str] = &["VOIDBOX_NODE", "VOIDBOX_ATTEMPT"];
/// The file a warm runtime's shells read the per-node variables from (`BASH_ENV`), written
/// before the prompt.
pub const NODE_ENV_FILE: &str = "/home/sandbox/.voidbox/node.env";

/// The request of a held runtime with the node's environment: the runtime's own variables,
/// then `extra`'s except [`PER_NODE_VARS`] — its shells get those from [`NODE_ENV_FILE`]
/// (`BASH_ENV`), see [`node_env_file`].
pub fn held_request(mut req: ExecRequest, extra: Vec<(String, String)>) -> ExecRequest {
    let mut extra: Vec<(String, String)> = extra
        .into_iter()
        .filter(|(k, _)| !PER_NODE_VARS.contains(&k.as_str()))
        .collect();
    extra.push(("BASH_ENV".into(), NODE_ENV_FILE.into()));
    req.env = crate::node::launch::merge_env(req.env, extra);
    req.timeout_secs = None;
    req
}

/// [`NODE_ENV_FILE`] for a node whose environment is `env`: its [`PER_NODE_VARS`], exported.
pub fn node_env_file(env: &[(String, String)]) -> GuestFile {
    let mut text = String::new();
    for (k, v) in env
        .iter()
        .filter(|(k, _)| PER_NODE_VARS.contains(&k.as_str()))
    {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    GuestFile {
        path: NODE_ENV_FILE.into(),
        data: text.into_bytes(),
        mode: 0o444,
    }
}

/// A private directory for a warm VM's gateway socket (mode 0700, removed when dropped).
pub fn gateway_dir(runtime_dir: Option<&Path>) -> Result<(tempfile::TempDir, PathBuf), String> {
    let parent = runtime_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("voidbox-gw-")
        .tempdir_in(&parent)
        .map_err(|e| format!("gateway socket directory in {}: {e}", parent.display()))?;
    let sock = dir.path().join("gw.sock");
    // sun_path holds 108 bytes with its terminating NUL.
    if sock.as_os_str().len() > 107 {
        return Err(format!(
            "the gateway socket path {} is longer than a Unix socket allows: set TMPDIR to a shorter directory",
            sock.display()
        ));
    }
    Ok((dir, sock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::Runtime;

    fn plan(text: &str) -> crate::plan::Plan {
        let v = voidbox_spec::validate::validate_source("t.yaml", text.into(), Path::new("."));
        let spec = v
            .spec
            .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
        crate::plan::Plan::compile(&spec, Path::new(".")).expect("plan")
    }

    fn node<'a>(p: &'a crate::plan::Plan, name: &str) -> &'a crate::plan::PlanNode {
        p.graph
            .node_weights()
            .find(|n| n.name == name)
            .expect("node")
    }

    const SPEC: &str = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: a, prompt: hi, llm: {provider: claude}}\n    - {name: m, prompt: hi, llm: {provider: mock}}\n    - {name: s, prompt: hi, llm: {provider: claude}, sandbox: {snapshot: abc}}\n    - {name: w, prompt: hi, llm: {provider: claude}, sandbox: {mounts: [{host: /tmp, guest: /workspace/x}]}}\n    - {name: c, run: {program: 'true'}}\n  stages:\n    - {type: fan_out, boxes: [a, m, s, w, c]}\n";

    #[test]
    fn every_cold_start_has_its_reason() {
        let p = plan(SPEC);
        assert_eq!(cold_reason(node(&p, "a"), Runtime::ClaudeCode, true), None);
        assert!(cold_reason(node(&p, "a"), Runtime::ClaudeCode, false)
            .is_some_and(|r| r.contains("--no-snapshot")));
        assert_eq!(
            cold_reason(node(&p, "m"), Runtime::Mock, true).as_deref(),
            Some(crate::node::warm_launch::MOCK_COLD)
        );
        assert!(cold_reason(node(&p, "s"), Runtime::ClaudeCode, true)
            .is_some_and(|r| r.contains("sandbox.snapshot")));
        assert!(cold_reason(node(&p, "w"), Runtime::ClaudeCode, true)
            .is_some_and(|r| r.contains("sandbox.mounts")));
        // Commands have no runtime to start.
        assert_eq!(cold_reason(node(&p, "c"), Runtime::ClaudeCode, true), None);
    }

    fn spec() -> WarmSpec {
        use crate::image::Profile;
        WarmSpec {
            golden: GoldenSpec {
                image: crate::sandbox::GuestImage {
                    hash: "a".repeat(64),
                    vmlinux: "/k".into(),
                    system_disk: "/d".into(),
                    system_disk_sha256: "d".repeat(64),
                    agent: "/a".into(),
                    initramfs: None,
                    profile: Profile::Compat,
                    cmdline: "quiet".into(),
                },
                memory_mb: 2048,
                vcpus: 1,
                extra_cmdline: vec![],
                disks: Default::default(),
                network: Some(crate::network::nat_config(
                    voidbox_net::NetworkPolicy::default(),
                    &[],
                )),
                share_slots: false,
            },
            launch: WarmLaunch {
                request: ExecRequest {
                    program: "/opt/claude".into(),
                    args: vec!["-p".into()],
                    env: vec![("ANTHROPIC_API_KEY".into(), TOKEN_MARK.into())],
                    ..ExecRequest::default()
                },
                files: vec![],
                format: crate::agent_output::Format::ClaudeStreamJson,
                layout: crate::kit::Layout::CLAUDE,
                runtime: Runtime::ClaudeCode,
            },
            kit: vec![GuestFile {
                path: "/home/sandbox/.claude/skills/s/SKILL.md".into(),
                data: b"v1".to_vec(),
                mode: 0o444,
            }],
            policy: None,
            network: None,
            provider: "claude".into(),
            model: Some("m".into()),
        }
    }

    #[test]
    fn the_key_covers_what_the_waiting_runtime_has_read() {
        let a = spec();
        assert_eq!(a.key(), spec().key());
        assert_ne!(a.key(), a.golden.key());
        type Change = Box<dyn Fn(&mut WarmSpec)>;
        let changed: Vec<Change> = vec![
            Box::new(|s| s.kit[0].data = b"v2".to_vec()),
            Box::new(|s| s.kit[0].mode = 0o400),
            Box::new(|s| s.model = Some("other".into())),
            Box::new(|s| s.provider = "custom".into()),
            Box::new(|s| s.golden.memory_mb = 4096),
            Box::new(|s| s.golden.image.hash = "b".repeat(64)),
            Box::new(|s| s.launch.request.args.push("--verbose".into())),
            Box::new(|s| s.launch.request.env.push(("X".into(), "1".into()))),
            Box::new(|s| s.launch.request.workdir = Some("/project".into())),
            Box::new(|s| {
                s.launch.files.push(GuestFile {
                    path: "/home/sandbox/.claude.json".into(),
                    data: b"{}".to_vec(),
                    mode: 0o600,
                })
            }),
            Box::new(|s| {
                s.network = Some(voidbox_net::NetworkPolicy {
                    allow_domains: vec!["example.com".into()],
                    ..voidbox_net::NetworkPolicy::default()
                })
            }),
            Box::new(|s| {
                s.policy = Some(GuestPolicy {
                    max_timeout_secs: Some(5),
                    ..GuestPolicy::default()
                })
            }),
        ];
        for (i, change) in changed.iter().enumerate() {
            let mut b = spec();
            change(&mut b);
            assert_ne!(a.key(), b.key(), "change {i} kept the key");
        }
        // The kit hash follows the kit only.
        let mut b = spec();
        b.model = None;
        assert_eq!(a.kit_hash(), b.kit_hash());
        b.kit[0].data = b"v2".to_vec();
        assert_ne!(a.kit_hash(), b.kit_hash());
    }

    #[test]
    fn per_node_variables_go_to_the_shells_not_the_runtime() {
        let env = vec![
            ("A".to_string(), "1".to_string()),
            ("VOIDBOX_NODE".to_string(), "it's".to_string()),
            ("VOIDBOX_ATTEMPT".to_string(), "2".to_string()),
        ];
        let req = held_request(
            ExecRequest {
                env: vec![("HOME".into(), "/home/sandbox".into())],
                timeout_secs: Some(9),
                ..ExecRequest::default()
            },
            env.clone(),
        );
        let names: Vec<&str> = req.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["HOME", "A", "BASH_ENV"]);
        assert_eq!(req.timeout_secs, None);
        let f = node_env_file(&env);
        assert_eq!(f.path, NODE_ENV_FILE);
        assert_eq!(
            String::from_utf8_lossy(&f.data),
            "export VOIDBOX_NODE='it'\\''s'\nexport VOIDBOX_ATTEMPT='2'\n"
        );
    }

    #[test]
    fn tokens_are_checked_when_read() {
        let d = tempfile::tempdir().unwrap();
        let t = new_token().unwrap();
        write_token(d.path(), &t).unwrap();
        assert_eq!(read_token(d.path()).unwrap().expose(), t);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join(TOKEN_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(d.path().join(TOKEN_FILE), "sk-real-key").unwrap();
        assert!(read_token(d.path())
            .unwrap_err()
            .contains("not a gateway token"));
    }
}
