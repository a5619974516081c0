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
//! Exit codes (as `voidbox run`): the program's own code (a signal `n` → 128+n, the
//! session's timeout → 124, refused by the guest policy → 126, not startable → 127); 2
//! usage (bad flag, unusable spec); 3 environment (no KVM, no guest image); 125 the VM
//! failed; 128+n when this process got SIGINT/SIGTERM/SIGHUP `n` (the session is hung up).

pub mod session;
pub mod terminal;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use voidbox_protocol::{ErrorCode, PtyOpen};

use crate::image::ProgressMode;
use crate::limits::Timeout;
use crate::mount_flag::{self as mounts, HostMount};
use crate::plan::{Action, Plan, PlanNode};
use crate::run::{guest_image, parse_env, start_vm};
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
    /// The program on the terminal: a bare name or an absolute guest path.
    #[arg(long, value_name = "PROGRAM", default_value = DEFAULT_PROGRAM)]
    pub program: String,
    /// Argument for the program (repeatable).
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
    /// default 86400).
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
}

/// Runs `voidbox shell`; `plan` is SPEC compiled (by the CLI), if one was given.
pub fn shell_cmd(args: &ShellArgs, plan: Option<Plan>) -> ExitCode {
    let setup = match Setup::new(args, plan.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args, setup, plan.as_ref()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
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
    network: Option<voidbox_net::Policy>,
    /// The NAT's DNS upstreams (`VOIDBOX_DNS_UPSTREAMS`, else the host's resolv.conf).
    dns_upstreams: Vec<std::net::SocketAddr>,
    timeout: Timeout,
}

impl Setup {
    fn new(args: &ShellArgs, plan: Option<&Plan>) -> Result<Setup, String> {
        let node = plan.map(interactive_node).transpose()?;
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
            timeout: Timeout::flag(Some(
                args.timeout.unwrap_or(crate::limits::MAX_TIMEOUT_SECS),
            )),
        })
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

/// The VM's settings: the defaults of `voidbox run`, else the spec's node as `apply` would
/// prepare it (image, boot override, disks, image environment), then the flags.
fn vm_config(
    args: &ShellArgs,
    setup: &Setup,
    plan: Option<&Plan>,
    base: GuestImage,
) -> Result<(SandboxConfig, Program), SandboxError> {
    let mut cfg = SandboxConfig::new(base.clone());
    let mut p = Program {
        env: Vec::new(),
        workdir: args.workdir.clone(),
    };
    if let (Some(node), Some(plan)) = (&setup.node, plan) {
        let vms =
            crate::apply::images::prepare(plan, &base, None, ProgressMode::Auto).map_err(|e| {
                SandboxError::Environment(match e {
                    Ok(refusals) => refusals
                        .iter()
                        .map(|r| r.message.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    Err(msg) => msg,
                })
            })?;
        if let Some(vm) = vms.get(&node.name) {
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
    cfg.memory_mb = args.memory_mb.unwrap_or(cfg.memory_mb);
    cfg.vcpus = args.vcpus.unwrap_or(cfg.vcpus);
    cfg.boot_timeout = Duration::from_secs(args.boot_timeout);
    cfg.network = setup
        .network
        .clone()
        .map(|p| crate::network::nat_config(p, &setup.dns_upstreams));
    cfg.wall_limit = Some(cfg.boot_timeout + Duration::from_secs(setup.timeout.secs + 60));
    let mut policy = crate::apply::policy::run_policy(&args.program, Some(setup.timeout.secs));
    if let (Some(node), Some(list)) = (&setup.node, policy.allowlist.as_mut()) {
        policy.rlimits = node.sandbox.limits.or_default();
        for p in crate::apply::policy::allowlist(node, None) {
            if !list.contains(&p) {
                list.push(p);
            }
        }
    }
    cfg.policy = Some(policy);
    cfg.shares = mounts::shares(&setup.mounts);
    Ok((cfg, p))
}

fn run(args: &ShellArgs, setup: Setup, plan: Option<&Plan>) -> Result<u8, SandboxError> {
    check_kvm()?;
    let (cfg, program) = vm_config(args, &setup, plan, guest_image()?)?;
    let named = setup
        .node
        .as_ref()
        .and_then(|n| n.sandbox.snapshot.as_deref());
    let mut sb = start_vm(&cfg, !args.no_snapshot, named)?;
    let signals =
        session::Signals::register().map_err(SandboxError::io("registering signal handlers"))?;
    let tty = terminal::stdin_is_tty();
    let (rows, cols) = if tty {
        terminal::size()
    } else {
        terminal::DEFAULT_SIZE
    };
    let open = PtyOpen {
        program: args.program.clone(),
        args: args.args.clone(),
        env: program.env,
        workdir: program.workdir,
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
        (Ok(r), None) => crate::run::exit_code_of(&args.program, &r, setup.timeout),
        (Err(SandboxError::Guest { code, message, .. }), None) => {
            let (why, exit) = match code {
                ErrorCode::NotAllowed => ("refused by the guest policy", 126),
                _ => ("cannot start it", 127),
            };
            eprintln!("voidbox: {}: {why}: {message}", args.program);
            exit
        }
        (Err(e), None) => return Err(e),
    };
    let end = sb.kill();
    let denied = crate::network::denial_total(&end.net_denials);
    if denied > 0 {
        eprintln!("voidbox: network: {denied} connection attempt(s) denied");
        for l in crate::network::denial_lines(&end.net_denials, 10) {
            eprintln!("voidbox:   {l}");
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests;
