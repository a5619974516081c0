//! `voidbox shell [SPEC]`: an interactive terminal in a fresh micro-VM, the interactive
//! sibling of `voidbox run`.
//!
//! Without SPEC the VM gets `voidbox run`'s defaults; with one (a `kind: sandbox` without
//! `run:`, or an agent with `mode: interactive`) it gets the spec's sandbox settings
//! (memory, vCPUs, image, environment, network, snapshot), which the flags override. The
//! VM is restored from a golden snapshot when possible, a guest PTY session runs
//! `--program` (default `/bin/sh`), and the host terminal is put in raw mode for it
//! ([`terminal`]) and restored on every exit path.
//!
//! An agent opens its own runtime (Claude Code's or Codex's terminal UI) instead, set up as
//! `voidbox apply` sets up an agent box ([`agent`]): the runtimes disk, the credential
//! gateway (the key stays on the host), the kit and the runtime's configuration, the spec's
//! prompt as the first message, the image's `WorkingDir` (else `/workspace`) as the working
//! directory (`--workdir` overrides it). `--program`/`--arg` are refused with an agent (exit 2): the terminal
//! runs the runtime. `--env` and the spec's variables reach the runtime except those it
//! sets itself. At the end the gateway's counters are printed to stderr.
//!
//! Exit codes (as `voidbox run`): the program's own code (a signal `n` → 128+n, the
//! session's timeout → 124, refused by the guest policy → 126, not startable → 127); 2
//! usage (bad flag, unusable spec, an agent on the mock runtime or with `--program`); 3
//! environment (no KVM, no guest image, an agent's provider or key missing, the runtimes
//! disk or gateway unavailable); 125 the VM failed; 128+n when this process got
//! SIGINT/SIGTERM/SIGHUP `n` (the session is hung up).

pub mod agent;
pub mod session;
pub mod terminal;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use voidbox_protocol::{ErrorCode, PtyOpen};

use crate::limits::Timeout;
use crate::mount_flag::{self as mounts, HostMount};
use crate::node::oci_images::NodeVm;
use crate::node::prepare::{Checks, Purpose};
use crate::node::refusals::SpecSource;
use crate::output::ProgressMode;
use crate::plan::{Action, Plan, PlanNode};
use crate::run::{guest_image, parse_env, start_vm};
use crate::sandbox::disks::ImageDisk;
use crate::sandbox::{check_kvm, GuestImage, SandboxConfig, SandboxError};
use crate::spec::model::{AgentMode, SandboxMode};

/// The program a shell runs unless `--program` says otherwise.
pub const DEFAULT_PROGRAM: &str = "/bin/sh";

/// `voidbox shell` arguments.
#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    /// A `kind: sandbox` spec without `run:` (or an agent with `mode: interactive`) whose
    /// sandbox settings the VM gets; without it, `voidbox run`'s defaults.
    #[arg(value_name = "SPEC")]
    pub spec: Option<PathBuf>,
    /// The program on the terminal: a bare name or an absolute guest path (default
    /// `/bin/sh`; refused with an agent spec, whose terminal runs the agent's runtime).
    #[arg(long, value_name = "PROGRAM")]
    pub program: Option<String>,
    /// Argument for the program (repeatable; refused with an agent spec).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Guest memory in MiB (default: the spec's, else 256).
    #[arg(long, value_name = "MIB", value_parser = crate::limits::memory_mb_arg())]
    pub memory_mb: Option<u32>,
    /// Number of vCPUs (default: the spec's, else 1).
    #[arg(long, value_name = "N", value_parser = crate::limits::vcpus_arg())]
    pub vcpus: Option<u8>,
    /// Environment variable for the program, over the spec's (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Working directory in the guest.
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workdir: Option<String>,
    /// Host directory shared into the VM: HOST:GUEST[:ro|rw] (repeatable; default `ro`;
    /// HOST relative to the working directory, a missing `rw` one is created).
    #[arg(long = "mount", value_name = "HOST:GUEST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// End the session (its whole process group) after this many seconds (1..=86400;
    /// default: the spec's `timeout_secs`, else 86400).
    #[arg(long, value_name = "SECS", value_parser = crate::limits::timeout_arg())]
    pub timeout: Option<u64>,
    /// Seconds to wait for the guest agent to come up.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub boot_timeout: u64,
    /// Cold-boot the VM instead of restoring it from a snapshot.
    #[arg(long)]
    pub no_snapshot: bool,
    /// Network device and policy (replaces the spec's `network`).
    #[command(flatten)]
    pub network: crate::network::flags::NetworkArgs,
    /// Do not connect to an agent's model endpoint before the VM starts.
    #[arg(long)]
    pub no_endpoint_check: bool,
}

/// Runs `voidbox shell`; `spec` is SPEC compiled (by the CLI) with its text, if one was
/// given.
pub fn shell_cmd(args: &ShellArgs, spec: Option<(Plan, SpecSource)>) -> ExitCode {
    let (plan, src) = match spec {
        Some((p, s)) => (Some(p), Some(s)),
        None => (None, None),
    };
    // What the spec opens (exit 2 for a spec that is not for a shell) comes first.
    let node = match plan.as_ref().map(interactive_node).transpose() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let agent = match &plan {
        Some(p) => agent::Agent::of(
            p,
            node.as_ref(),
            args.program.is_some() || !args.args.is_empty(),
            &|k| std::env::var(k).ok(),
        ),
        None => Ok(None),
    };
    let mut agent = match agent {
        Ok(a) => a,
        Err(f) => {
            eprintln!("error: {}", f.message);
            return ExitCode::from(f.code);
        }
    };
    // What `apply` refuses is refused here too (an agent's `mode: interactive` is what a
    // shell is for), at its line; the endpoint is reached and `remote:` skills fetched.
    let prepared = match (&plan, &src) {
        (Some(p), Some(src)) => {
            let checks = Checks {
                spec: Some(src),
                purpose: Purpose::Shell,
                endpoint_check: !args.no_endpoint_check,
                trace_file: None,
            };
            match crate::node::prepare::prepare(p, &checks) {
                Ok(prepared) => Some(prepared),
                Err(code) => return ExitCode::from(code),
            }
        }
        _ => None,
    };
    // The flags and the spec's settings together (mount directories are created here).
    let setup = match Setup::new(args, plan.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut prepared = prepared;
    if let (Some(a), Some(pr)) = (agent.as_mut(), prepared.as_mut()) {
        a.remotes = std::mem::take(&mut pr.remotes);
    }
    let trace = match (&plan, &setup.node, prepared) {
        (Some(p), Some(node), Some(pr)) => match trace::SessionTrace::start(pr.observe, p, node) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(3);
            }
        },
        _ => None,
    };
    let spec = plan.as_ref().zip(src.as_ref());
    let (code, error) = match run(args, setup, spec, agent) {
        Ok(code) => (code, None),
        Err(f) if f.message.is_empty() => (f.code, None),
        Err(f) => {
            eprintln!("error: {}", f.message);
            (f.code, Some(f.message))
        }
    };
    let code = match (trace, &plan) {
        (Some(t), Some(p)) => t.end(p, code, error),
        _ => code,
    };
    ExitCode::from(code)
}

/// Why `voidbox shell` stopped outside a session, with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// What went wrong (and how to proceed).
    pub message: String,
}

impl Failure {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

impl From<SandboxError> for Failure {
    fn from(e: SandboxError) -> Failure {
        Failure {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

/// Everything checked before a VM starts.
#[derive(Debug)]
struct Setup {
    /// The spec's only node (a sandbox without `run:` or an interactive agent).
    node: Option<PlanNode>,
    env: Vec<(String, String)>,
    mounts: Vec<HostMount>,
    network: Option<voidbox_net::NetworkPolicy>,
    /// The NAT's DNS upstreams (`VOIDBOX_DNS_UPSTREAMS`, else the host's resolv.conf).
    dns_upstreams: Vec<std::net::SocketAddr>,
    timeout: Timeout,
}

impl Setup {
    fn new(args: &ShellArgs, plan: Option<&Plan>) -> Result<Setup, String> {
        let node = plan.map(interactive_node).transpose()?;
        let node_timeout = node.as_ref().and_then(|n| n.timeout_secs);
        let sandbox = node.as_ref().map(|n| &n.sandbox);
        let mut env: Vec<(String, String)> = Vec::new();
        for (k, v) in sandbox.map(|s| &s.env).into_iter().flatten() {
            // An empty value copies the host's (as `apply` does).
            let v = if v.is_empty() {
                std::env::var(k).unwrap_or_default()
            } else {
                v.clone()
            };
            env.push((k.clone(), v));
        }
        env.extend(parse_env(&args.env)?);
        let cwd = std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?;
        let mut all = Vec::new();
        for m in sandbox.map(|s| s.mounts.as_slice()).unwrap_or_default() {
            let missing = sandbox.map(|s| s.create_mount_dirs.as_slice());
            all.push(mounts::from_spec(m, missing.unwrap_or_default())?);
        }
        for a in &args.mounts {
            all.push(mounts::parse(a, &cwd)?);
        }
        // Missing `rw` directories are created now, so the shares check sees them.
        mounts::create_dirs(&all)?;
        crate::sandbox::shares::check(&mounts::shares(&all), false).map_err(|e| e.to_string())?;
        let network = match args.network.policy()? {
            Some(p) => Some(p),
            None => sandbox.and_then(|s| s.network.clone()),
        };
        let dns_upstreams = match network {
            Some(_) => crate::network::upstreams::from_env()?,
            None => Vec::new(),
        };
        Ok(Setup {
            dns_upstreams,
            node,
            env,
            mounts: all,
            network,
            timeout: session_timeout(
                args.timeout,
                node_timeout,
                plan.and_then(|p| p.timeout_secs),
            ),
        })
    }
}

/// The session's time limit: `--timeout`, else the node's `timeout_secs`, else the spec's
/// run `timeout_secs`, else the longest a session may last.
fn session_timeout(flag: Option<u64>, node: Option<u64>, run: Option<u64>) -> Timeout {
    match (flag, node, run) {
        (Some(secs), _, _) => Timeout::flag(Some(secs)),
        (None, Some(secs), _) => Timeout::node(Some(secs)),
        (None, None, Some(secs)) => Timeout::pipeline(secs),
        (None, None, None) => Timeout::flag(Some(crate::limits::MAX_TIMEOUT_SECS)),
    }
}

/// The node a spec opens: the only one of a `kind: sandbox` without `run:` or of an
/// agent with `mode: interactive`.
fn interactive_node(plan: &Plan) -> Result<PlanNode, String> {
    if plan.mode == SandboxMode::Mock {
        return Err(format!(
            "`{}` has `sandbox.mode: mock`, which never runs anything",
            plan.name
        ));
    }
    let mut nodes = plan.graph.node_weights();
    let only = match (nodes.next(), nodes.next()) {
        (Some(n), None) => n,
        _ => {
            return Err(format!(
                "`{}` is a {}; `voidbox shell` opens a `kind: sandbox` without `run:` or an agent with `mode: interactive`",
                plan.name,
                plan.kind.as_str()
            ))
        }
    };
    match &only.action {
        Action::Shell => Ok(only.clone()),
        Action::Agent(a) if a.mode == AgentMode::Interactive => Ok(only.clone()),
        Action::Command(_) => Err(format!(
            "`{}` runs a command (`run:`); `voidbox shell` opens a sandbox without `run:`\n  help: run it with `voidbox apply`, or remove `run:`",
            plan.name
        )),
        Action::Agent(_) => Err(format!(
            "`{}` is an agent with a task; `voidbox shell` opens an agent only with `mode: interactive`\n  help: run it with `voidbox apply`",
            plan.name
        )),
    }
}

/// What the session runs, besides the VM.
struct Program {
    env: Vec<(String, String)>,
    workdir: Option<String>,
}

/// What an agent's session adds to the VM: the runtimes disk and the gateway's port.
struct AgentVm {
    disk: ImageDisk,
    gateway_port: Option<u16>,
}

/// The spec's node prepared as `apply` prepares it (image pulled and converted, boot
/// override, disks, the image's `Env` and `WorkingDir`); `None` without a spec.
fn node_vm(
    setup: &Setup,
    plan: Option<&Plan>,
    base: &GuestImage,
) -> Result<Option<NodeVm>, SandboxError> {
    let (Some(node), Some(plan)) = (&setup.node, plan) else {
        return Ok(None);
    };
    let mut vms =
        crate::node::oci_images::prepare(plan, base, None, ProgressMode::Auto).map_err(|e| {
            SandboxError::Environment(match e {
                Ok(refusals) => refusals
                    .iter()
                    .map(|r| r.message.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                Err(msg) => msg,
            })
        })?;
    Ok(vms.remove(&node.name))
}

/// Where an agent's runtime starts: `--workdir`, else the image's `WorkingDir` (as `apply`
/// runs an agent in an image), else `/workspace`.
fn agent_workdir<'a>(flag: Option<&'a str>, vm: Option<&'a NodeVm>) -> &'a str {
    flag.or_else(|| vm.and_then(|v| v.workdir.as_deref()))
        .unwrap_or(crate::node::launch::WORKDIR)
}

/// The VM's settings: the defaults of `voidbox run`, else the spec's node as `apply` would
/// prepare it (`vm`: image, boot override, disks, image environment), then the flags;
/// `program` is what the terminal runs (the guest policy allows it), `agent` what an agent
/// adds.
fn vm_config(
    args: &ShellArgs,
    setup: &Setup,
    vm: Option<&NodeVm>,
    base: GuestImage,
    program: &str,
    agent: Option<AgentVm>,
) -> Result<(SandboxConfig, Program), SandboxError> {
    let mut cfg = SandboxConfig::new(base);
    let mut p = Program {
        env: Vec::new(),
        workdir: args.workdir.clone(),
    };
    if let Some(node) = &setup.node {
        if let Some(vm) = vm {
            if let Some(image) = &vm.image {
                cfg.image = image.clone();
            }
            cfg.disks = vm.disks.clone();
            p.env.extend(vm.env.iter().cloned());
            p.workdir = p.workdir.or_else(|| vm.workdir.clone());
        }
        cfg.memory_mb = u32::try_from(node.sandbox.memory_mb).unwrap_or(u32::MAX);
        cfg.vcpus = u8::try_from(node.sandbox.vcpus).unwrap_or(u8::MAX);
    }
    p.env.extend(setup.env.iter().cloned());
    let gateway_port = agent.as_ref().and_then(|a| a.gateway_port);
    if let Some(a) = agent {
        // The real runtimes come on their own read-only disk, as in `apply`.
        cfg.disks.images.push(a.disk);
        cfg.disks.check().map_err(SandboxError::Environment)?;
    }
    cfg.memory_mb = args.memory_mb.unwrap_or(cfg.memory_mb);
    cfg.vcpus = args.vcpus.unwrap_or(cfg.vcpus);
    cfg.boot_timeout = Duration::from_secs(args.boot_timeout);
    cfg.network = crate::gateway::guest_network(setup.network.clone(), gateway_port)
        .map(|p| crate::network::nat_config(p, &setup.dns_upstreams));
    cfg.wall_limit = Some(cfg.boot_timeout + Duration::from_secs(setup.timeout.secs + 60));
    let mut policy = crate::node::policy::run_policy(program, Some(setup.timeout.secs));
    if let (Some(node), Some(list)) = (&setup.node, policy.allowlist.as_mut()) {
        policy.rlimits = node.sandbox.limits.or_default();
        // An agent's runtime is its own program; a sandbox has none.
        for p in crate::node::policy::allowlist(node, Some(program)) {
            if !list.contains(&p) {
                list.push(p);
            }
        }
    }
    cfg.policy = Some(policy);
    cfg.set_shares(mounts::shares(&setup.mounts));
    Ok((cfg, p))
}

fn run(
    args: &ShellArgs,
    setup: Setup,
    spec: Option<(&Plan, &SpecSource)>,
    agent: Option<agent::Agent>,
) -> Result<u8, Failure> {
    check_kvm()?;
    let base = guest_image()?;
    let plan = spec.map(|(p, _)| p);
    if let Some((p, src)) = spec {
        // `cli:` programs and a spec-named snapshot, against the image that boots.
        if let Err(code) = crate::node::prepare::check_image(p, src, &base, !args.no_snapshot) {
            // The refusals are printed at their lines already.
            return Err(Failure {
                code,
                message: String::new(),
            });
        }
    }
    // The node as `apply` prepares it (its image pulled and converted), then an agent's
    // host side: runtimes disk, gateway, kit (nothing in a VM yet).
    let vm = node_vm(&setup, plan, &base)?;
    let session = match (&agent, plan, &setup.node) {
        (Some(a), Some(plan), Some(node)) => {
            let workdir = agent_workdir(args.workdir.as_deref(), vm.as_ref());
            Some(a.prepare(plan, node, workdir)?)
        }
        _ => None,
    };
    let program = match &session {
        Some(s) => s.launch.request.program.clone(),
        None => args
            .program
            .clone()
            .unwrap_or_else(|| DEFAULT_PROGRAM.to_string()),
    };
    let extra = session.as_ref().map(|s| AgentVm {
        disk: s.disk.clone(),
        gateway_port: s.gateway.port(),
    });
    let (cfg, vm_program) = vm_config(args, &setup, vm.as_ref(), base, &program, extra)?;
    let named = setup
        .node
        .as_ref()
        .and_then(|n| n.sandbox.snapshot.as_deref());
    let mut sb = start_vm(&cfg, !args.no_snapshot, named)?;
    let (prog_args, env, workdir) = match &session {
        Some(s) => {
            // The runtime's configuration and the kit, in place before it starts.
            for f in &s.files {
                if let Err(e) = sb.write_file(&f.path, &f.data, Some(f.mode)) {
                    sb.kill();
                    return Err(Failure::from(e));
                }
            }
            let req = s.request(vm_program.env);
            (req.args, req.env, req.workdir)
        }
        None => (args.args.clone(), vm_program.env, vm_program.workdir),
    };
    let signals =
        session::Signals::register().map_err(SandboxError::io("registering signal handlers"))?;
    let tty = terminal::stdin_is_tty();
    let (rows, cols) = if tty {
        terminal::size()
    } else {
        terminal::DEFAULT_SIZE
    };
    let open = PtyOpen {
        program: program.clone(),
        args: prog_args,
        env,
        workdir,
        rows,
        cols,
        timeout_secs: Some(setup.timeout.secs),
        ..PtyOpen::default()
    };
    let raw = terminal::RawMode::enter().map_err(SandboxError::io("raw terminal mode"))?;
    let end = session::run(&mut sb, open, tty, signals);
    drop(raw);
    let code = match (end.result, end.signal) {
        (_, Some(sig)) => {
            eprintln!(
                "voidbox: session hung up on {}",
                crate::sandbox::error::signal_name(sig)
            );
            128u8.saturating_add(sig as u8)
        }
        (Ok(r), None) => crate::run::exit_code_of(&program, &r, setup.timeout),
        (Err(SandboxError::Guest { code, message, .. }), None) => {
            let (why, exit) = match code {
                ErrorCode::NotAllowed => ("refused by the guest policy", 126),
                _ => ("cannot start it", 127),
            };
            eprintln!("voidbox: {program}: {why}: {message}");
            exit
        }
        (Err(e), None) => {
            sb.kill();
            if let Some(s) = session {
                s.finish();
            }
            return Err(e.into());
        }
    };
    let end = sb.kill();
    let denied = crate::network::denial_total(&end.net_denials);
    if denied > 0 {
        eprintln!("voidbox: network: {denied} connection attempt(s) denied");
        for l in crate::network::denial_lines(&end.net_denials, 10) {
            eprintln!("voidbox:   {l}");
        }
    }
    if let Some(s) = session {
        s.finish();
    }
    Ok(code)
}

#[cfg(test)]
mod tests;
