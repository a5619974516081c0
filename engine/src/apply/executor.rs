//! The real executor: every attempt boots a fresh VM, copies the input (and skills) in,
//! runs the command or agent runtime, collects the output and kills the VM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use voidbox_protocol::{ErrorCode, ExecRequest, ExecResponse, OutputStream};

use crate::agent_output::{Format, OutputParser};
use crate::capped::{over_cap, CappedBuf, Tail};
use crate::gateway::Gateway;
use crate::node::agent::{kit_files, GuestFile, DEFAULT_OUTPUT_FILE};
use crate::node::launch::{launch, GatewayAccess};
use crate::plan::Action;
use crate::providers::{Endpoint, Runtime};
use crate::sandbox::guest::{Attach, Attached};
use crate::sandbox::{GuestImage, Sandbox, SandboxConfig, SandboxError, VmmLauncher};
use crate::scheduler::cancel::{kill_vmm_children, NodeControl, StopReason};
use crate::scheduler::{Attempt, Executor, GuestSample, GuestUsage, Job, Status};

/// Guest path of a node's input.
pub const INPUT_FILE: &str = "/workspace/input.json";
/// Stderr bytes kept for reports.
const STDERR_TAIL: usize = 8 * 1024;
/// Grace after a node's timeout (its `timeout_secs`, else the default) before the host
/// kills the VM.
const HOST_DEADLINE_GRACE: Duration = crate::run::HOST_DEADLINE_GRACE;

/// Runs attempts in fresh micro-VMs.
pub struct VmExecutor {
    /// Kernel + system disk.
    pub image: GuestImage,
    /// Per node: image disks, user, image environment and boot override
    /// ([`crate::node::oci_images::prepare`]); nodes missing here boot `image` as is.
    pub node_vms: std::collections::HashMap<String, crate::node::oci_images::NodeVm>,
    /// How VMMs are started.
    pub launcher: VmmLauncher,
    /// Boot deadline per VM.
    pub boot_timeout: Duration,
    /// Directory receiving `<node>.<attempt>.console.log` (the node name encoded by
    /// [`crate::names::file_component`]).
    pub logs_dir: PathBuf,
    /// Where box outputs (artifacts) are collected: `<dir>/artifacts/<name>/`
    /// ([`super::artifacts::store_dir`]); box inputs are read there too unless given.
    pub artifacts_dir: PathBuf,
    /// Box inputs that come from outside the run (a node runner's `--inputs`): artifact name
    /// → its directory.
    pub given_artifacts: std::collections::HashMap<String, PathBuf>,
    /// Parent of the per-VM temp dirs.
    pub runtime_dir: Option<PathBuf>,
    /// Resolves `file:` skills.
    pub spec_dir: PathBuf,
    /// On abort, kill every VMM child of this process (the CLI owns all of them).
    pub kill_children_on_abort: bool,
    /// Golden snapshot policy (restore instead of cold boot).
    pub snapshots: crate::snapshot::Snapshots,
    /// DNS upstreams of the NAT of nodes with network (empty: the host's resolv.conf).
    pub dns_upstreams: Vec<std::net::SocketAddr>,
    /// Per agent node: its resolved LLM endpoint ([`crate::providers::resolve`]).
    pub endpoints: std::collections::HashMap<String, Endpoint>,
    /// The plan's fetched `remote:` skills ([`crate::kit::fetch_remotes`]).
    pub remotes: crate::kit::Remotes,
    /// Ask the guest for its telemetry just before and after the command (for metrics).
    pub guest_telemetry: bool,
    /// With `guest_telemetry`, also sample it every [`TELEMETRY_EVERY`] while the command
    /// runs, keeping the last this many samples (`observe.telemetry_buffer_size`; 0: none).
    pub telemetry_buffer: usize,
    /// How services and their dependents reach each other.
    pub services: crate::network::services::ServiceNet,
    /// Agent runtimes start warm where they can ([`crate::node::warm_snapshot`]); `false` starts
    /// every one in its VM (benchmarks compare the two).
    pub warm_runtimes: bool,
}

/// Time between readiness checks of a service.
const READY_POLL: Duration = Duration::from_millis(200);
/// Bound on opening the readiness connection to a service's guest agent.
const SIDE_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Time between guest telemetry samples while a command runs (each costs the guest ≈140 ms
/// of interpreted kernel on a software-KVM host, well under 1 ms with hardware KVM).
pub const TELEMETRY_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per attempt when the spec does not say (`observe.telemetry_buffer_size`).
pub const DEFAULT_TELEMETRY_BUFFER: usize = 64;

/// What an attempt runs, prepared on the host before its VM starts.
struct Prepared {
    /// The exec request (for a warm runtime: the held runtime's, for the policy and messages).
    req: ExecRequest,
    files: Vec<GuestFile>,
    output_file: Option<String>,
    /// An agent's output format and endpoint.
    agent: Option<(Format, Endpoint)>,
    /// A warm runtime: attach to the held runtime and hold this conversation with it,
    /// instead of running `req`.
    attach: Option<AttachRun>,
}

/// The conversation with a warm runtime, and the attempt's deadline in seconds.
struct AttachRun {
    conversation: Box<dyn crate::node::warm_launch::Conversation>,
    timeout_secs: u64,
}

/// A warm attempt prepared on the host: the snapshot's spec, the VM's settings (restore
/// source still unset) and the gateway socket's private directory.
struct WarmPrep {
    spec: crate::node::warm_snapshot::WarmSpec,
    cfg: SandboxConfig,
    gw_dir: tempfile::TempDir,
    sock: PathBuf,
    prepared: Prepared,
}

impl Executor for VmExecutor {
    fn run(&self, job: &Job, ctl: &NodeControl) -> Attempt {
        let console = self.logs_dir.join(format!(
            "{}.{}.console.log",
            crate::names::file_component(&job.node.name),
            job.attempt
        ));
        let mut a = self.attempt(job, ctl, &console);
        if console.exists() {
            a.console_log = Some(console);
        }
        a
    }

    fn abort_all(&self) {
        if self.kill_children_on_abort {
            kill_vmm_children();
        }
    }
}

fn sandbox_failure(e: SandboxError) -> Attempt {
    let env = matches!(e, SandboxError::Environment(_));
    let mut a = Attempt::failed(Status::Failed, e.to_string());
    a.environment = env;
    a
}

/// A failed exec: the guest refusing to start the program is the node's failure with a
/// shell-style exit code (127 not found, 126 refused by the policy, as `voidbox run`);
/// anything else is the VM's ([`sandbox_failure`]).
fn exec_failure(program: &str, e: SandboxError) -> Attempt {
    match crate::sandbox::error::refused_exec(program, &e) {
        Some((code, why)) => {
            let mut a = Attempt::failed(Status::Failed, why);
            a.exit_code = Some(i32::from(code));
            a
        }
        None => sandbox_failure(e),
    }
}

impl VmExecutor {
    /// The VM's settings; `gateway_port`: the node's credential gateway, which its NAT
    /// then lets the guest reach (and, for a node without network, nothing else).
    fn config(
        &self,
        job: &Job,
        console: &Path,
        program: &str,
        gateway_port: Option<u16>,
    ) -> SandboxConfig {
        let vm = self.node_vms.get(&job.node.name);
        let image = vm.and_then(|v| v.image.clone());
        let mut cfg = SandboxConfig::new(image.unwrap_or_else(|| self.image.clone()));
        if let Some(v) = vm {
            cfg.disks = v.disks.clone();
        }
        let policy = crate::gateway::guest_network(job.node.sandbox.network.clone(), gateway_port)
            // A service or a dependent without network of its own still needs a device for
            // the service connections: one that reaches nothing else.
            .or_else(|| {
                self.services
                    .needs_nic(&job.node.name)
                    .then(|| voidbox_net::NetworkPolicy {
                        public_egress: false,
                        ..voidbox_net::NetworkPolicy::default()
                    })
            });
        cfg.network = policy.map(|p| {
            let mut nat = crate::network::nat_config(p, &self.dns_upstreams);
            self.services.apply_to(&job.node.name, &mut nat);
            nat
        });
        cfg.memory_mb = u32::try_from(job.node.sandbox.memory_mb).unwrap_or(u32::MAX);
        cfg.vcpus = u8::try_from(job.node.sandbox.vcpus).unwrap_or(u8::MAX);
        cfg.launcher = self.launcher.clone();
        cfg.boot_timeout = self.boot_timeout;
        cfg.keep_console = Some(console.to_path_buf());
        cfg.runtime_dir = self.runtime_dir.clone();
        // Allowlist + rlimits, in force before the first request (see `policy`).
        cfg.policy = Some(crate::node::policy::node_policy(&job.node, Some(program)));
        // Backstop enforced by the VMM itself, should the host deadline thread fail.
        cfg.wall_limit = Some(
            self.boot_timeout
                + Duration::from_secs(job.node.timeout().secs)
                + Duration::from_secs(60),
        );
        cfg
    }

    fn attempt(&self, job: &Job, ctl: &NodeControl, console: &Path) -> Attempt {
        if ctl.stopped().is_some() {
            return Attempt::failed(Status::Cancelled, "cancelled before start");
        }
        let endpoint = self.endpoints.get(&job.node.name);
        if let (Action::Agent(ag), Some(e)) = (&job.node.action, endpoint) {
            let snapshots = self.snapshots.store.is_some();
            let reason =
                match crate::node::warm_snapshot::cold_reason(&job.node, e.runtime, snapshots) {
                    None if !self.warm_runtimes => Some("warm runtimes are off".to_string()),
                    other => other,
                };
            return match reason {
                None => self.attempt_warm(job, ctl, console, ag, e),
                Some(reason) => self.attempt_cold(job, ctl, console, Some(reason)),
            };
        }
        self.attempt_cold(job, ctl, console, None)
    }

    /// An attempt whose agent runtime (if any) starts in the VM; `cold`: why an agent's
    /// could not start warm (for the report).
    fn attempt_cold(
        &self,
        job: &Job,
        ctl: &NodeControl,
        console: &Path,
        cold: Option<String>,
    ) -> Attempt {
        let mut a = self.attempt_in_vm(job, ctl, console);
        a.runtime_start = cold.map(|reason| crate::scheduler::RuntimeStart::Cold { reason });
        a
    }

    fn attempt_in_vm(&self, job: &Job, ctl: &NodeControl, console: &Path) -> Attempt {
        // Everything that can fail on the host is checked before a VM boots.
        let endpoint = self.endpoints.get(&job.node.name);
        // A real runtime talks to the model through its own gateway, started per VM.
        let gateway = match endpoint.filter(|e| e.runtime != Runtime::Mock) {
            Some(e) => match Gateway::start(e) {
                Ok(g) => Some(g),
                Err(e) => {
                    let mut a = Attempt::failed(
                        Status::Failed,
                        format!("cannot start the credential gateway: {e}"),
                    );
                    a.environment = true;
                    return a;
                }
            },
            None => None,
        };
        let access = gateway.as_ref().map(|g| GatewayAccess {
            base_url: g.guest_base_url(),
            token: g.token().to_string(),
        });
        let mut kit = None;
        let prepared = match self.request(job, endpoint, access.as_ref(), &mut kit) {
            Ok(x) => x,
            Err(e) => return Attempt::failed(Status::Failed, e),
        };
        // `rw` mounts whose host directory did not exist are created now (as void-box does).
        let sandbox = &job.node.sandbox;
        let mounts = sandbox
            .mounts
            .iter()
            .map(|m| crate::mount_flag::from_spec(m, &sandbox.create_mount_dirs))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|m| crate::mount_flag::create_dirs(&m).map(|()| m));
        let mounts = match mounts {
            Ok(m) => m,
            Err(e) => {
                let mut a = Attempt::failed(Status::Failed, format!("mount: {e}"));
                a.environment = true;
                return a;
            }
        };
        let boot_t0 = Instant::now();
        let boot_wall = SystemTime::now();
        let named = job.node.sandbox.snapshot.as_deref();
        let cancelled = || ctl.stopped().is_some();
        let mut cfg = self.config(
            job,
            console,
            &prepared.req.program,
            gateway.as_ref().and_then(Gateway::port),
        );
        cfg.set_shares(crate::mount_flag::shares(&mounts));
        let sb = match self.snapshots.start(&cfg, named, &cancelled) {
            Ok(sb) => sb,
            Err(_) if cancelled() => return Attempt::failed(Status::Cancelled, "cancelled"),
            Err(e) => return sandbox_failure(e),
        };
        self.started(sb, job, ctl, prepared, (boot_t0, boot_wall), gateway, kit)
    }

    /// The rest of an attempt once its VM runs: the command (or the conversation with a warm
    /// runtime), the output, the VM killed.
    #[allow(clippy::too_many_arguments)]
    fn started(
        &self,
        mut sb: Sandbox,
        job: &Job,
        ctl: &NodeControl,
        prepared: Prepared,
        (boot_t0, boot_wall): (Instant, SystemTime),
        gateway: Option<Gateway>,
        kit: Option<crate::kit::KitSummary>,
    ) -> Attempt {
        let boot = boot_t0.elapsed();
        let booted_wall = SystemTime::now();
        let restored = sb.timings().restore.is_some();
        let snapshot = sb
            .restored_from()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned());
        if !ctl.register_pid(sb.vmm_pid()) {
            drop(sb);
            return Attempt::failed(Status::Cancelled, "cancelled");
        }
        let mut a = self.in_vm(&mut sb, job, ctl, prepared);
        ctl.clear_pid();
        // Killed first, so the NAT's last counts are in.
        let exit = sb.kill();
        a.net_denials = exit.net_denials;
        if let Some(s) = a.service.as_mut() {
            s.connections = exit.net_inbound;
        }
        a.gateway = gateway.map(Gateway::stop);
        a.kit = kit;
        a.boot = Some(boot);
        a.restored = Some(restored);
        a.phases.vm_start = Some((boot_wall, booted_wall));
        a.phases.snapshot = snapshot;
        a
    }

    /// The exec request, the files to write first, the output file and, for an agent, how
    /// its output is parsed; `kit_summary` gets an agent's kit summary once staged.
    fn request(
        &self,
        job: &Job,
        endpoint: Option<&Endpoint>,
        gateway: Option<&GatewayAccess>,
        kit_summary: &mut Option<crate::kit::KitSummary>,
    ) -> Result<Prepared, String> {
        let vm = self.node_vms.get(&job.node.name);
        let (mut env, image_workdir) = self.node_env(job);
        match &job.node.action {
            Action::Command(c) => {
                // A runtime program on the runtimes disk is found on `PATH`; the node's own
                // `PATH`, set after, replaces it.
                if !crate::node::command_runtimes::of(&job.node).is_empty() {
                    env.insert(0, ("PATH".into(), crate::node::command_runtimes::path()));
                }
                env.extend(c.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                let (program, args) = crate::node::oci_images::command_line(c, vm)?;
                Ok(Prepared {
                    req: ExecRequest {
                        program,
                        args,
                        env,
                        workdir: c.workdir.clone().or(image_workdir),
                        stdin: job.input.stdin.clone().unwrap_or_default(),
                        timeout_secs: Some(job.node.timeout().secs),
                        ..ExecRequest::default()
                    },
                    files: Vec::new(),
                    output_file: Some(DEFAULT_OUTPUT_FILE.to_string()),
                    agent: None,
                    attach: None,
                })
            }
            Action::Agent(ag) => {
                let endpoint = endpoint.ok_or_else(|| {
                    format!(
                        "internal: agent node `{}` has no resolved endpoint",
                        job.node.name
                    )
                })?;
                let out = ag
                    .output_file
                    .clone()
                    .unwrap_or_else(|| DEFAULT_OUTPUT_FILE.into());
                let l = launch(ag, endpoint, gateway, &out, Some(job.node.timeout().secs))?;
                let (skills, kit) = self.kit(job, ag, endpoint, l.layout)?;
                *kit_summary = Some(kit);
                let mut req = l.request;
                // The node's variables after the runtime's, except those the runtime needs
                // (`PATH`: the runtime's directories, then the node's, an image's included).
                req.env = crate::node::launch::merge_env(req.env, env);
                // In an image, the agent works in the image's `WorkingDir` (made if missing).
                if let Some(w) = image_workdir {
                    req.workdir = Some(w);
                }
                // The per-node variables in a file too, as a warm runtime's shells get them.
                let mut files = vec![crate::node::warm_snapshot::node_env_file(&req.env)];
                files.extend(l.files);
                files.extend(skills);
                Ok(Prepared {
                    req,
                    files,
                    output_file: Some(out),
                    agent: Some((l.format, endpoint.clone())),
                    attach: None,
                })
            }
            Action::Shell => Err("an interactive sandbox (no `run:`) has nothing to run".into()),
        }
    }

    /// An agent's kit laid out for its runtime (`layout`), the node's secrets and the
    /// provider's key redacted, with its summary for the report.
    fn kit(
        &self,
        job: &Job,
        ag: &crate::plan::AgentAction,
        endpoint: &Endpoint,
        layout: crate::kit::Layout,
    ) -> Result<(Vec<GuestFile>, crate::kit::KitSummary), String> {
        let mut secrets = crate::kit::Secrets::for_node(&job.node);
        if let Some(c) = &endpoint.credential {
            secrets = secrets.with(c.secret().expose());
        }
        let src = crate::kit::Sources {
            spec_dir: &self.spec_dir,
            skills: &ag.skills,
            prompt_files: &ag.prompt_files,
            layout,
            remotes: &self.remotes,
        };
        kit_files(&src, &secrets)
    }

    /// The node's environment — its image's `Env`, then the spec's variables (an empty value
    /// copies the host's), then `VOIDBOX_NODE` and `VOIDBOX_ATTEMPT` — and its image's
    /// `WorkingDir`.
    fn node_env(&self, job: &Job) -> (Vec<(String, String)>, Option<String>) {
        let vm = self.node_vms.get(&job.node.name);
        let mut env: Vec<(String, String)> = vm.map(|v| v.env.clone()).unwrap_or_default();
        for (k, v) in &job.node.sandbox.env {
            let v = if v.is_empty() {
                std::env::var(k).unwrap_or_default()
            } else {
                v.clone()
            };
            env.push((k.clone(), v));
        }
        env.push(("VOIDBOX_NODE".into(), job.node.name.clone()));
        env.push(("VOIDBOX_ATTEMPT".into(), job.attempt.to_string()));
        (env, vm.and_then(|v| v.workdir.clone()))
    }

    /// An agent attempt restored with its runtime already running ([`crate::node::warm_snapshot`]):
    /// the warm snapshot is made first if the cache has none. A node whose warm snapshot
    /// cannot be made or is refused starts its runtime cold, with a notice and the reason in
    /// the report.
    fn attempt_warm(
        &self,
        job: &Job,
        ctl: &NodeControl,
        console: &Path,
        ag: &crate::plan::AgentAction,
        endpoint: &Endpoint,
    ) -> Attempt {
        let cold = |why: String| {
            (self.snapshots.notice)(&format!(
                "{}: its agent runtime starts cold: {why}",
                job.node.name
            ));
            self.attempt_cold(job, ctl, console, Some(why))
        };
        let Some(store) = self.snapshots.store.as_ref() else {
            return cold("snapshots are off".into());
        };
        let mut kit = None;
        let w = match self.warm_prepare(job, ag, endpoint, console, &mut kit) {
            Ok(Ok(w)) => w,
            Ok(Err(reason)) => return cold(reason),
            Err(e) => return Attempt::failed(Status::Failed, e),
        };
        let boot_t0 = Instant::now();
        let boot_wall = SystemTime::now();
        let cancelled = || ctl.stopped().is_some();
        let lease = match crate::node::warm_snapshot::ensure_warm(
            store,
            &w.spec,
            &self.snapshots.create,
            self.snapshots.max_bytes,
            &*self.snapshots.notice,
            &cancelled,
        ) {
            Ok(l) => l,
            Err(_) if cancelled() => return Attempt::failed(Status::Cancelled, "cancelled"),
            Err(e) => {
                let e = e.to_string();
                return cold(format!("its warm snapshot could not be made: {e}"));
            }
        };
        let key = lease.lease.entry.meta.key.clone();
        let options = crate::gateway::GatewayOptions {
            listen: crate::gateway::Listen::Unix(w.sock.clone()),
            token: Some(lease.token.clone()),
            fresh_identity: true,
            ..crate::gateway::GatewayOptions::from_env()
        };
        let gateway = match Gateway::start_with(endpoint, &options) {
            Ok(g) => g,
            Err(e) => {
                let mut a = Attempt::failed(
                    Status::Failed,
                    format!("cannot start the credential gateway: {e}"),
                );
                a.environment = true;
                return a;
            }
        };
        let mut cfg = w.cfg;
        cfg.restore = Some(lease.lease.restore.clone());
        let sb = match Sandbox::start(&cfg) {
            Ok(sb) => sb,
            Err(_) if cancelled() => return Attempt::failed(Status::Cancelled, "cancelled"),
            Err(SandboxError::SnapshotRefused(why)) => {
                drop(lease);
                crate::snapshot::discard_broken(store, &key, &why, &*self.snapshots.notice);
                return cold(format!("its warm snapshot was refused: {why}"));
            }
            Err(e) => return sandbox_failure(e),
        };
        let created = lease.created;
        drop(lease);
        let mut a = self.started(
            sb,
            job,
            ctl,
            w.prepared,
            (boot_t0, boot_wall),
            Some(gateway),
            kit,
        );
        drop(w.gw_dir);
        a.runtime_start = Some(crate::scheduler::RuntimeStart::Warm {
            snapshot: key[..12].to_string(),
            created,
        });
        a
    }

    /// What a warm attempt needs, prepared on the host: `Ok(Err(reason))` when the node
    /// cannot start warm after all (its runtime has no waiting mode for it).
    fn warm_prepare(
        &self,
        job: &Job,
        ag: &crate::plan::AgentAction,
        endpoint: &Endpoint,
        console: &Path,
        kit_summary: &mut Option<crate::kit::KitSummary>,
    ) -> Result<Result<WarmPrep, String>, String> {
        use crate::node::warm_snapshot as warm;
        let access = GatewayAccess {
            base_url: warm::gateway_base_url(endpoint.guest_path()),
            token: warm::TOKEN_MARK.into(),
        };
        let launch = match crate::node::warm_launch::warm_launch(ag, endpoint, &access) {
            Ok(l) => l,
            Err(reason) => return Ok(Err(reason.0)),
        };
        let (kit, summary) = self.kit(job, ag, endpoint, launch.layout)?;
        *kit_summary = Some(summary);
        let (env, image_workdir) = self.node_env(job);
        let node_env = warm::node_env_file(&env);
        let mut launch = launch;
        launch.request = warm::held_request(launch.request, env);
        if let Some(w) = image_workdir {
            launch.request.workdir = Some(w);
        }
        let (gw_dir, sock) = warm::gateway_dir(self.runtime_dir.as_deref())?;
        let mut cfg = self.config(job, console, &launch.request.program, None);
        let mut nat = cfg.network.take().unwrap_or_else(|| {
            let mut nat = crate::network::nat_config(
                voidbox_net::NetworkPolicy {
                    public_egress: false,
                    ..voidbox_net::NetworkPolicy::default()
                },
                &self.dns_upstreams,
            );
            self.services.apply_to(&job.node.name, &mut nat);
            nat
        });
        nat.services.push(warm::gateway_route(&sock));
        cfg.network = Some(nat);
        let spec = warm::WarmSpec {
            golden: crate::snapshot::GoldenSpec::of(&cfg),
            launch: launch.clone(),
            kit,
            policy: cfg.policy.clone(),
            network: job.node.sandbox.network.clone(),
            provider: endpoint.provider.as_str().to_string(),
            model: endpoint.model.clone(),
        };
        let out = ag
            .output_file
            .clone()
            .unwrap_or_else(|| DEFAULT_OUTPUT_FILE.into());
        let cwd = launch.request.workdir.clone();
        let prepared = Prepared {
            req: launch.request,
            files: vec![node_env],
            output_file: Some(out),
            agent: Some((launch.format, endpoint.clone())),
            attach: Some(AttachRun {
                conversation: crate::node::warm_launch::conversation(
                    launch.runtime,
                    &ag.prompt,
                    endpoint.model.as_deref(),
                    cwd.as_deref(),
                ),
                timeout_secs: job.node.timeout().secs,
            }),
        };
        Ok(Ok(WarmPrep {
            spec,
            cfg,
            gw_dir,
            sock,
            prepared,
        }))
    }

    fn in_vm(&self, sb: &mut Sandbox, job: &Job, ctl: &NodeControl, p: Prepared) -> Attempt {
        let Prepared {
            req,
            files,
            output_file,
            agent,
            attach,
        } = p;
        let provision_t0 = SystemTime::now();
        if let Some(input) = &job.input.file {
            if let Err(e) = sb.write_file(INPUT_FILE, input, Some(0o644)) {
                return stopped_or(ctl, sandbox_failure(e));
            }
        }
        for f in &files {
            if let Err(e) = sb.write_file(&f.path, &f.data, Some(f.mode)) {
                return stopped_or(ctl, sandbox_failure(e));
            }
        }
        if let Err(e) = super::artifacts::place_inputs(
            sb,
            &job.node,
            &self.artifacts_dir,
            &self.given_artifacts,
        ) {
            return stopped_or(ctl, Attempt::failed(Status::Failed, e));
        }
        // A command node's program as prepared (its image's entrypoint when `run` names
        // none), for the report and messages.
        let program = matches!(job.node.action, Action::Command(_)).then(|| req.program.clone());
        let shown = program
            .as_deref()
            .unwrap_or("the agent runtime")
            .to_string();
        let mut stdout = CappedBuf::new(job.max_output);
        let mut stderr = Tail::new(STDERR_TAIL);
        let mut stream = agent
            .as_ref()
            .map(|(format, _)| OutputParser::new(*format, job.max_output));
        // Telemetry is best effort: a guest that cannot answer just has no usage recorded.
        let before = self.guest_telemetry.then(|| sb.telemetry().ok()).flatten();
        ctl.arm_deadline(Duration::from_secs(job.node.timeout().secs) + HOST_DEADLINE_GRACE);
        let exec_wall = SystemTime::now();
        let t0 = Instant::now();
        let mut samples = std::collections::VecDeque::new();
        let (mut taken, mut peak) = (0u64, 0u64);
        let cap = self.telemetry_buffer;
        let mut on_sample = |t: voidbox_protocol::Telemetry| {
            if let Some(b) = &before {
                let s = GuestSample::new(b, &t);
                taken += 1;
                peak = peak.max(s.mem_used_kb);
                if samples.len() >= cap {
                    samples.pop_front();
                }
                samples.push_back(s);
            }
        };
        let sampling = (before.is_some() && cap > 0).then_some(crate::sandbox::guest::Sampling {
            every: TELEMETRY_EVERY,
            on_sample: &mut on_sample,
        });
        // A service's readiness is watched on a second connection while the command runs.
        let watch = job.node.service.as_ref().map(|svc| Watch {
            ports: svc.ports.clone(),
            addr: self.services.probe_addr(&job.node.name),
            file: matches!(job.node.action, Action::Agent(_))
                .then(|| output_file.clone())
                .flatten(),
            within: Duration::from_secs(svc.ready_timeout_secs),
            max_output: job.max_output,
        });
        let side = match &watch {
            Some(_) => match sb.side_connection(SIDE_CONNECT_TIMEOUT) {
                Ok(c) => Some(c),
                Err(e) => return stopped_or(ctl, sandbox_failure(e)),
            },
            None => None,
        };
        let foreground = self.services.foreground(&job.node.name);
        let (stop_watch, watch_stopped) = std::sync::mpsc::channel::<()>();
        let (res, readiness) = std::thread::scope(|scope| {
            let watcher = watch.as_ref().zip(side).map(|(w, mut conn)| {
                scope.spawn(move || watch_ready(&mut conn, w, ctl, &watch_stopped, t0))
            });
            // A foreground service's output streams (to stderr: stdout is the run's result).
            let echo = |data: &[u8]| {
                if foreground {
                    use std::io::Write;
                    let _ = std::io::stderr().lock().write_all(data);
                }
            };
            let res = match attach {
                None => sb
                    .exec_sampled(
                        req,
                        &mut |s, data| {
                            echo(data);
                            match s {
                                OutputStream::Stdout => {
                                    stdout.push(data);
                                    if let Some(p) = stream.as_mut() {
                                        p.push(data);
                                    }
                                }
                                OutputStream::Stderr => stderr.push(data),
                            }
                        },
                        sampling,
                    )
                    .map(|r| (r, false)),
                Some(AttachRun {
                    mut conversation,
                    timeout_secs,
                }) => {
                    let first = conversation.start();
                    let mut lines = LineSplitter::new(job.max_output);
                    sb.exec_attach(
                        crate::node::warm_snapshot::HELD,
                        first,
                        Some(timeout_secs),
                        &mut |s, data| {
                            echo(data);
                            match s {
                                OutputStream::Stdout => {
                                    stdout.push(data);
                                    if let Some(p) = stream.as_mut() {
                                        p.push(data);
                                    }
                                    let mut reply = Vec::new();
                                    lines.push(data, |line| {
                                        reply.extend(conversation.on_line(line));
                                    });
                                    if conversation.finished() {
                                        Attach::Finish
                                    } else if reply.is_empty() {
                                        Attach::Continue
                                    } else {
                                        Attach::Write(reply)
                                    }
                                }
                                OutputStream::Stderr => {
                                    stderr.push(data);
                                    Attach::Continue
                                }
                            }
                        },
                        sampling,
                    )
                    .map(|a| match a {
                        Attached::Exited(r) => (r, false),
                        // Done at its final event: the runtime was stopped, not waited for.
                        Attached::Finished { duration } => (
                            ExecResponse {
                                duration_ms: duration.as_millis() as u64,
                                ..ExecResponse::default()
                            },
                            true,
                        ),
                    })
                }
            };
            drop(stop_watch);
            let readiness = watcher.and_then(|w| w.join().ok());
            (res, readiness)
        });
        let exec = t0.elapsed();
        let exec_end = SystemTime::now();
        let guest = match (&before, &res) {
            (Some(b), Ok(_)) => sb
                .telemetry()
                .ok()
                .map(|after| GuestUsage::between(b, &after, samples.into(), taken, peak)),
            _ => None,
        };
        let mut a = match res {
            Ok((r, finished)) => {
                let outcome = stream.map(OutputParser::finish);
                let mut a = self.collect(
                    sb,
                    job,
                    &shown,
                    (&r, finished),
                    stdout,
                    outcome.as_ref(),
                    &output_file,
                );
                if let (Some(o), Some((_, e))) = (&outcome, &agent) {
                    a.agent = Some(crate::node::agent::stats(o, e));
                }
                if a.status == Status::Succeeded {
                    match super::artifacts::collect_outputs(
                        sb,
                        &job.node,
                        &self.artifacts_dir,
                        job.max_output,
                    ) {
                        Ok(stats) => a.artifacts = stats,
                        Err(e) => {
                            a.status = Status::Failed;
                            a.error = Some(e);
                        }
                    }
                }
                a
            }
            Err(e) => exec_failure(&shown, e),
        };
        if let Some(Readiness::NotReady(why)) = &readiness {
            let secs = watch.as_ref().map_or(0, |w| w.within.as_secs());
            a = Attempt::failed(
                Status::Failed,
                format!("service not ready within ready_timeout_secs={secs} s: {why}"),
            );
        }
        if let Some(svc) = &job.node.service {
            let ready = match readiness {
                Some(Readiness::Ready(after, at)) => Some((after, at)),
                _ => None,
            };
            a.service = Some(crate::scheduler::ServiceStats {
                ready_ms: ready.map(|(after, _)| after.as_millis() as u64),
                ready_at: ready.map(|(_, at)| at),
                ports: svc.ports.clone(),
                ..crate::scheduler::ServiceStats::default()
            });
        }
        a.exec = Some(exec);
        a.program = program;
        // The tail goes to the summary, the JSON report and JUnit: the node's secrets never do.
        a.stderr_tail = crate::kit::Secrets::for_node(&job.node)
            .redact(&stderr.text())
            .0;
        a.guest = guest;
        a.phases.provision = Some((provision_t0, exec_wall));
        a.phases.exec = Some((exec_wall, exec_end));
        a.phases.collect = Some((exec_end, SystemTime::now()));
        stopped_or(ctl, a)
    }

    /// The attempt from the exec's response; `program` names what ran, for messages.
    #[allow(clippy::too_many_arguments)]
    fn collect(
        &self,
        sb: &mut Sandbox,
        job: &Job,
        program: &str,
        (r, finished): (&ExecResponse, bool),
        stdout: CappedBuf,
        outcome: Option<&crate::agent_output::AgentOutcome>,
        output_file: &Option<String>,
    ) -> Attempt {
        let mut a = if r.timed_out {
            Attempt::failed(
                Status::TimedOut,
                format!(
                    "timed out: {} fired (the guest killed the command)",
                    job.node.timeout()
                ),
            )
        } else if let Some(e) = &r.error {
            Attempt::failed(Status::Failed, format!("cannot run {program}: {e}"))
        } else if let Some(o) = outcome.filter(|o| o.is_error) {
            // The runtime's own message says more than its exit status.
            let why = o.failure().unwrap_or_default();
            Attempt::failed(Status::Failed, format!("the agent runtime failed: {why}"))
        } else if !finished && !r.success() {
            let how = crate::scheduler::exit_words(r.exit_code, r.signal)
                .unwrap_or_else(|| "unknown status".into());
            Attempt::failed(Status::Failed, format!("{program} failed: {how}"))
        } else if r.output_truncated {
            Attempt::failed(
                Status::Failed,
                "the guest dropped output beyond its policy limit",
            )
        } else if let Some(why) = outcome.and_then(|o| o.failure()) {
            Attempt::failed(Status::Failed, format!("the agent runtime failed: {why}"))
        } else if finished && outcome.is_none_or(|o| o.result.is_none()) {
            Attempt::failed(
                Status::Failed,
                "the agent runtime finished without a result",
            )
        } else {
            match self.output(
                sb,
                job,
                stdout,
                Ok(outcome.and_then(|o| o.result.clone())),
                output_file,
            ) {
                Ok(o) => Attempt::ok(o),
                Err(e) => Attempt::failed(Status::Failed, e),
            }
        };
        // A warm runtime is stopped at its final event: it has no exit status to report.
        a.exit_code = r.exit_code;
        a.signal = r.signal;
        a
    }

    /// `output_file` if the node wrote it, else stdout (agents: the whole result text, or
    /// the error saying it exceeds the cap).
    fn output(
        &self,
        sb: &mut Sandbox,
        job: &Job,
        stdout: CappedBuf,
        result: Result<Option<String>, String>,
        output_file: &Option<String>,
    ) -> Result<Vec<u8>, String> {
        if let Some(path) = output_file {
            match sb.read_file(path, job.max_output.saturating_add(1)) {
                Ok(data) if data.len() as u64 > job.max_output => {
                    return Err(over_cap(path, data.len() as u64, job.max_output))
                }
                Ok(data) => return Ok(data),
                Err(SandboxError::Guest {
                    code: ErrorCode::NotFound,
                    ..
                }) => {}
                Err(SandboxError::Guest {
                    code: ErrorCode::TooLarge,
                    ..
                }) => {
                    return Err(over_cap(
                        path,
                        job.max_output.saturating_add(1),
                        job.max_output,
                    ))
                }
                Err(e) => return Err(format!("reading {path}: {e}")),
            }
        }
        match result? {
            Some(r) => Ok(r.into_bytes()),
            None => stdout.into_result("stdout"),
        }
    }
}

/// What a service needs to be ready.
struct Watch {
    /// Each accepts a TCP connection in the guest,
    ports: Vec<u16>,
    /// at this address of the guest (its loopback when `None`): where its dependents reach it.
    addr: Option<std::net::Ipv4Addr>,
    /// An agent's output file is complete: no guest process holds it open for writing (its
    /// content is the output its dependents get).
    file: Option<String>,
    /// The bound (`ready_timeout_secs`).
    within: Duration,
    /// The output cap.
    max_output: u64,
}

/// How a service's readiness watch ended.
enum Readiness {
    /// Ready this long after its command started, at this time.
    Ready(Duration, SystemTime),
    /// Not ready in time (why); the VM was stopped.
    NotReady(String),
    /// The command ended (or the VM died) first.
    Ended,
}

/// Polls a service's readiness on its own guest connection until it is ready (told to the
/// scheduler with its output), its bound passes (the VM is stopped), or `stopped` says the
/// command ended. Without ports or a file, ready once the guest runs its command.
fn watch_ready(
    conn: &mut crate::sandbox::GuestConn,
    w: &Watch,
    ctl: &NodeControl,
    stopped: &std::sync::mpsc::Receiver<()>,
    t0: Instant,
) -> Readiness {
    let deadline = t0 + w.within;
    loop {
        let check = if !w.ports.is_empty() {
            conn.probe_ports(&w.ports, w.addr)
                .map(|open| closed_ports(&w.ports, &open, w.addr))
        } else if let Some(path) = &w.file {
            match conn.read_complete_file(path, w.max_output.saturating_add(1)) {
                Ok(data) if data.len() as u64 > w.max_output => {
                    Ok(Err(over_cap(path, data.len() as u64, w.max_output)))
                }
                Ok(data) => Ok(Ok(data)),
                Err(SandboxError::Guest {
                    code: ErrorCode::NotFound,
                    ..
                }) => Ok(Err(format!("{path} was not written"))),
                Err(SandboxError::Guest {
                    code: ErrorCode::Busy,
                    ..
                }) => Ok(Err(format!("{path} is still being written"))),
                Err(e) => Err(e),
            }
        } else {
            conn.telemetry().map(|t| {
                if t.active_execs > 0 {
                    Ok(Vec::new())
                } else {
                    Err("its command did not start".to_string())
                }
            })
        };
        match check {
            Ok(Ok(output)) => {
                ctl.ready(output);
                return Readiness::Ready(t0.elapsed(), SystemTime::now());
            }
            Ok(Err(why)) if Instant::now() >= deadline => {
                ctl.stop(StopReason::NotReady);
                return Readiness::NotReady(why);
            }
            Ok(Err(_)) => {}
            Err(e) => {
                // The VM is gone or going (the exec then ends and reports how), or the guest
                // cannot answer: a service nobody can see ready must not run on forever.
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Duration::from_secs(1))
                {
                    ctl.stop(StopReason::NotReady);
                    return Readiness::NotReady(format!("its readiness cannot be checked: {e}"));
                }
                return Readiness::Ended;
            }
        }
        match stopped.recv_timeout(READY_POLL) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return Readiness::Ended,
        }
    }
}

/// Ready (`Ok`) when every port of `ports` is in `open`; else why not, naming the address
/// probed when it is not the loopback (a listener bound to 127.0.0.1 only is not reached
/// there).
fn closed_ports(
    ports: &[u16],
    open: &[u16],
    addr: Option<std::net::Ipv4Addr>,
) -> Result<Vec<u8>, String> {
    let closed: Vec<String> = ports
        .iter()
        .filter(|p| !open.contains(p))
        .map(u16::to_string)
        .collect();
    let at = addr.map_or(String::new(), |a| {
        format!(" at {a}, the address its dependents reach (listen on 0.0.0.0 or {a})")
    });
    match closed.len() {
        0 => Ok(Vec::new()),
        1 => Err(format!("port {} accepted no connection{at}", closed[0])),
        _ => Err(format!(
            "ports {} accepted no connection{at}",
            closed.join(", ")
        )),
    }
}

/// An attempt stopped from outside reports that, not the VM death it caused.
fn stopped_or(ctl: &NodeControl, a: Attempt) -> Attempt {
    match ctl.stopped() {
        Some(StopReason::Cancelled) => Attempt {
            status: Status::Cancelled,
            ..a
        },
        Some(StopReason::TimedOut) => Attempt {
            status: Status::TimedOut,
            ..a
        },
        // A stopped sidecar's success, or a service not ready: the scheduler and the
        // readiness watch say which.
        Some(StopReason::ServiceDone | StopReason::NotReady) | None => a,
    }
}

/// Splits a stream into lines (without their newline) for a warm runtime's conversation;
/// a line longer than its cap is cut there (the rest of it is dropped).
struct LineSplitter {
    line: Vec<u8>,
    cap: usize,
}

impl LineSplitter {
    fn new(cap: u64) -> LineSplitter {
        LineSplitter {
            line: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
        }
    }

    /// Feeds `data`, calling `on_line` for each line it completes.
    fn push(&mut self, data: &[u8], mut on_line: impl FnMut(&[u8])) {
        for piece in data.split_inclusive(|&b| b == b'\n') {
            let (body, done) = match piece.strip_suffix(b"\n") {
                Some(b) => (b, true),
                None => (piece, false),
            };
            let room = self.cap.saturating_sub(self.line.len());
            self.line.extend_from_slice(&body[..body.len().min(room)]);
            if done {
                on_line(&self.line);
                self.line.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_across_chunks_and_capped() {
        let mut s = LineSplitter::new(8);
        let mut got = Vec::new();
        for chunk in [
            &b"{\"a\":"[..],
            b"1}\n{\"b\"",
            b":2}\nxxxxxxxxxxxxxx\n",
            b"tail",
        ] {
            s.push(chunk, |l| got.push(String::from_utf8_lossy(l).into_owned()));
        }
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "xxxxxxxx"]);
        assert_eq!(s.line, b"tail");
    }

    #[test]
    fn closed_ports_name_the_address_probed() {
        assert_eq!(closed_ports(&[80, 9], &[9, 80], None), Ok(Vec::new()));
        assert_eq!(
            closed_ports(&[9], &[], None),
            Err("port 9 accepted no connection".to_string())
        );
        let e = closed_ports(&[80, 9, 7], &[80], Some(voidbox_net::GUEST_IP)).unwrap_err();
        assert_eq!(
            e,
            "ports 9, 7 accepted no connection at 10.0.2.15, the address its dependents reach (listen on 0.0.0.0 or 10.0.2.15)"
        );
    }

    #[test]
    fn exec_refusals_get_shell_exit_codes() {
        let refused = |code| SandboxError::Guest {
            what: "exec".into(),
            code,
            message: "program `ehco` not found in PATH (/usr/bin:/bin)".into(),
        };
        let a = exec_failure("ehco", refused(ErrorCode::NotFound));
        assert_eq!((a.status, a.exit_code), (Status::Failed, Some(127)));
        assert!(!a.environment);
        let why = a.error.unwrap_or_default();
        assert!(
            why.starts_with("cannot run ehco: program `ehco` not found"),
            "{why}"
        );
        assert_eq!(
            exec_failure("x", refused(ErrorCode::NotAllowed)).exit_code,
            Some(126)
        );
        let a = exec_failure("x", refused(ErrorCode::Io));
        assert_eq!(a.exit_code, None);
        assert!(a.error.unwrap_or_default().contains("guest refused exec"));
    }
}
