//! `voidbox run [OPTIONS] -- CMD [ARGS…]`: one command in a fresh micro-VM.
//!
//! Exit codes: the guest command's own code (a signal `n` → 128+n, a guest timeout → 124,
//! not startable → 127, refused by the guest policy → 126); 3 environment (no KVM, no
//! guest image); 125 the VM failed (boot failure, VMM crash — the console tail is quoted);
//! 2 usage (a bad `--env`, `--mount`, network flag or `VOIDBOX_DNS_UPSTREAMS`).
//!
//! `--mount HOST:GUEST[:ro|rw]` shares a host directory into the VM ([`crate::mount_flag`],
//! virtio-9p: [`crate::sandbox::shares`]).
//!
//! `--network` (or any policy flag) gives the VM a network device behind a user-mode NAT;
//! what the NAT denied is listed on stderr after the command. `--publish` forwards host TCP
//! addresses to guest ports through that NAT ([`crate::network::publish`]); a host address
//! that cannot be listened on is exit 3 before the VM boots.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use voidbox_protocol::{ExecRequest, ExecResponse, OutputStream, EXIT_NOT_ALLOWED};

use crate::limits::Timeout;
use crate::output::ProgressMode;
use crate::sandbox::{check_kvm, GuestImage, SandboxConfig, SandboxError};
use crate::scheduler::cancel::{NodeControl, StopReason};

/// `voidbox run` arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Guest memory in MiB (64..=65536, like the spec's `memory_mb`).
    #[arg(long, default_value_t = crate::limits::DEFAULT_RUN_MEMORY_MB, value_parser = crate::limits::memory_mb_arg())]
    pub memory_mb: u32,
    /// Number of vCPUs (1..=32, like the spec's `vcpus`).
    #[arg(long, default_value_t = 1, value_parser = crate::limits::vcpus_arg())]
    pub vcpus: u8,
    /// Keep the guest console log (its path is printed on stderr).
    #[arg(long)]
    pub keep_console: bool,
    /// Kill the command (its whole process group) after this many seconds (1..=86400;
    /// default: the default node timeout, 1800 s). The host kills the VM if the guest does not.
    #[arg(long, value_name = "SECS", value_parser = crate::limits::timeout_arg())]
    pub timeout: Option<u64>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Working directory in the guest.
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workdir: Option<String>,
    /// Seconds to wait for the guest agent to come up (a cold boot takes 10-30 s on a KVM
    /// that interprets guest kernel code, longer when several VMs boot at once).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub boot_timeout: u64,
    /// Cold-boot the VM instead of restoring it from the golden snapshot.
    #[arg(long)]
    pub no_snapshot: bool,
    /// Share a host directory: HOST:GUEST[:ro|rw] (default `ro`; a missing `rw` host
    /// directory is created; repeatable, at most 4).
    #[arg(long = "mount", value_name = "HOST:GUEST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// Network device and policy.
    #[command(flatten)]
    pub network: crate::network::flags::NetworkArgs,
    /// Forward host TCP connections to a guest port: [ADDR:]HOST_PORT:GUEST_PORT (loopback
    /// unless ADDR is given; repeatable). Gives the VM a network device; without `--network`
    /// the guest itself reaches nothing outside.
    #[arg(long = "publish", short = 'p', value_name = "[ADDR:]HOST:GUEST", value_parser = crate::network::publish::parse)]
    pub publish: Vec<voidbox_net::Publish>,
    /// The command and its arguments. Everything from the first value on is the command's
    /// (`run ls -la`); a flag before it is voidbox's own, so a misspelt one
    /// (`run --memory 512 -- true`) is a usage error, not the program to start.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs `voidbox run`.
pub fn run_cmd(args: &RunArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(args: &RunArgs) -> Result<u8, SandboxError> {
    let env = match parse_env(&args.env) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    let policy = match args.network.policy() {
        // Published ports need the NAT; the guest's own egress stays off unless asked for.
        Ok(None) if !args.publish.is_empty() => Some(voidbox_net::NetworkPolicy {
            public_egress: false,
            ..voidbox_net::NetworkPolicy::default()
        }),
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    if let Err(e) = crate::network::publish::check_free(&args.publish) {
        eprintln!("error: {e}");
        return Ok(3);
    }
    let dns_upstreams = match policy
        .as_ref()
        .map(|_| crate::network::upstreams::from_env())
    {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
        Some(Ok(u)) => u,
        None => Vec::new(),
    };
    let shares = match mounts(&args.mounts) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    check_kvm()?;
    let image = guest_image()?;
    // Dead runs' directories go first; this run's goes with it, however it ends (SIGINT and
    // SIGTERM included: `signals` kills the VM and this function returns).
    crate::sandbox::rundir::sweep_at_start();
    let rundir = crate::sandbox::rundir::RunDir::create("voidbox-run-")
        .map_err(SandboxError::io("creating the run's temporary directory"))?;
    let ctl = NodeControl::new();
    let signals = Signals::watch(ctl.clone())?;
    let mut cfg = SandboxConfig::new(image);
    cfg.runtime_dir = Some(rundir.path().to_path_buf());
    cfg.set_shares(shares);
    cfg.memory_mb = args.memory_mb;
    cfg.vcpus = args.vcpus;
    cfg.boot_timeout = Duration::from_secs(args.boot_timeout);
    cfg.network = policy.map(|p| {
        let mut nat = crate::network::nat_config(p, &dns_upstreams);
        nat.publish = args.publish.clone();
        nat
    });
    for p in &args.publish {
        eprintln!(
            "voidbox: publishing {} -> guest port {}",
            p.host, p.guest_port
        );
    }
    let timeout = Timeout::flag(args.timeout);
    // Host-side backstop: the VMM exits on its own once the guest had its full time.
    cfg.wall_limit = Some(cfg.boot_timeout + Duration::from_secs(timeout.secs + 60));
    if args.keep_console {
        cfg.keep_console = Some(kept_console_path());
    }
    let (program, rest) = match args.command.split_first() {
        Some(x) => x,
        None => return Ok(2),
    };
    // The guest may start this program and nothing else (children are not filtered).
    cfg.policy = Some(crate::node::policy::run_policy(program, args.timeout));
    let req = ExecRequest {
        program: program.clone(),
        args: rest.to_vec(),
        env,
        workdir: args.workdir.clone(),
        timeout_secs: Some(timeout.secs),
        ..ExecRequest::default()
    };
    let started = start_vm_until(&cfg, !args.no_snapshot, None, &|| ctl.stopped().is_some());
    if let Some(p) = &cfg.keep_console {
        eprintln!("voidbox: guest console log kept at {}", p.display());
    }
    if let Some(code) = signals.stopped() {
        return Ok(code);
    }
    let mut sb = started?;
    if !ctl.register_pid(sb.vmm_pid()) {
        drop(sb);
        return Ok(signals.stopped().unwrap_or(125));
    }
    // The host's own deadline: a guest too busy to stop its command in time (a fork bomb)
    // loses its VM HOST_DEADLINE_GRACE after the timeout.
    ctl.arm_deadline(Duration::from_secs(timeout.secs) + HOST_DEADLINE_GRACE);
    let t0 = std::time::Instant::now();
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let res = sb.exec(req, &mut |stream, data| {
        let w: &mut dyn Write = match stream {
            OutputStream::Stdout => &mut out,
            OutputStream::Stderr => &mut err,
        };
        let _ = w.write_all(data);
        let _ = w.flush();
    });
    ctl.finish();
    if let Some(code) = signals.stopped() {
        return Ok(code);
    }
    let code = match res {
        Ok(r) => exit_code_of(program, &r, timeout),
        Err(_) if ctl.stopped() == Some(StopReason::TimedOut) => {
            eprintln!(
                "voidbox: {program}: timed out: {timeout} fired (after {} ms); the guest did not stop it, so its VM was killed",
                t0.elapsed().as_millis()
            );
            124
        }
        Err(e) => match crate::sandbox::error::refused_exec(program, &e) {
            Some((code, why)) => {
                eprintln!("voidbox: {why}");
                code
            }
            None => return Err(e),
        },
    };
    let end = sb.stop();
    if !end.net_denials.is_empty() {
        eprintln!("voidbox: {}", denied_summary(&end.net_denials));
        for l in crate::network::denial_lines(&end.net_denials, 10) {
            eprintln!("voidbox:   {l}");
        }
    }
    Ok(code)
}

/// `NAME=VALUE` pairs of `--env`.
pub fn parse_env(pairs: &[String]) -> Result<Vec<(String, String)>, String> {
    pairs
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("--env takes NAME=VALUE, not `{kv}`")),
        })
        .collect()
}

/// The shares of the `--mount` values, parsed against the working directory, their
/// missing `rw` host directories created, and checked as a set
/// ([`crate::sandbox::shares::check`]).
fn mounts(args: &[String]) -> Result<Vec<crate::sandbox::shares::Share>, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?;
    let all = args
        .iter()
        .map(|a| crate::mount_flag::parse(a, &cwd))
        .collect::<Result<Vec<_>, _>>()?;
    crate::mount_flag::create_dirs(&all)?;
    let shares = crate::mount_flag::shares(&all);
    crate::sandbox::shares::check(&shares, false).map_err(|e| e.to_string())?;
    Ok(shares)
}

/// The cached guest image, built first (minutes, once) when there is none.
pub fn guest_image() -> Result<GuestImage, SandboxError> {
    if let Some(i) = GuestImage::cached()? {
        return Ok(i);
    }
    eprintln!("no guest image in the cache; building it now (takes minutes, once)");
    GuestImage::ensure(ProgressMode::Auto)
}

/// Starts one VM for `cfg`, restored from the `named` snapshot or a golden one when
/// `snapshots` (a golden snapshot is made on first use), else cold-booted; notices go to
/// stderr.
pub fn start_vm(
    cfg: &SandboxConfig,
    snapshots: bool,
    named: Option<&str>,
) -> Result<crate::sandbox::Sandbox, SandboxError> {
    start_vm_until(cfg, snapshots, named, &|| false)
}

/// [`start_vm`], giving up on a wait (for another process's golden snapshot) once
/// `cancelled` is true.
pub fn start_vm_until(
    cfg: &SandboxConfig,
    snapshots: bool,
    named: Option<&str>,
    cancelled: &dyn Fn() -> bool,
) -> Result<crate::sandbox::Sandbox, SandboxError> {
    let create = crate::snapshot::CreateOptions {
        launcher: cfg.launcher.clone(),
        boot_timeout: cfg.boot_timeout,
        runtime_dir: cfg.runtime_dir.clone(),
    };
    let notice = std::sync::Arc::new(|m: &str| eprintln!("voidbox: {m}"));
    crate::snapshot::Snapshots::new(snapshots, create, PathBuf::from("."), notice)
        .map_err(SandboxError::Environment)?
        .start(cfg, named, cancelled)
}

/// How long after its timeout a command's VM is killed when the guest has not answered:
/// the guest's own timer starts a little later (the request's transit), and a guest that
/// is not overloaded answers well within this.
pub const HOST_DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// SIGINT and SIGTERM during a `voidbox run`: the first one stops the run (its VMM, or any
/// VMM still booting, is killed at once) and the run exits 128+n with nothing left behind.
struct Signals {
    got: std::sync::Arc<std::sync::atomic::AtomicI32>,
}

impl Signals {
    /// Installs the handlers (kept until the process exits, so a second Ctrl-C cannot kill
    /// it mid-cleanup); a signal stops `ctl`.
    fn watch(ctl: NodeControl) -> Result<Signals, SandboxError> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(SandboxError::io("the signal handler's runtime"))?;
        let (mut int, mut term) = {
            let _in = rt.enter();
            let int =
                signal(SignalKind::interrupt()).map_err(SandboxError::io("SIGINT handler"))?;
            let term =
                signal(SignalKind::terminate()).map_err(SandboxError::io("SIGTERM handler"))?;
            (int, term)
        };
        let got = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let seen = std::sync::Arc::clone(&got);
        std::thread::Builder::new()
            .name("voidbox-signals".into())
            .spawn(move || {
                rt.block_on(async move {
                    let sig = tokio::select! {
                        _ = int.recv() => libc::SIGINT,
                        _ = term.recv() => libc::SIGTERM,
                    };
                    seen.store(sig, std::sync::atomic::Ordering::SeqCst);
                    ctl.stop(StopReason::Cancelled);
                    crate::scheduler::cancel::kill_vmm_children();
                    loop {
                        tokio::select! {
                            _ = int.recv() => {}
                            _ = term.recv() => {}
                        }
                    }
                })
            })
            .map_err(SandboxError::io("the signal handler's thread"))?;
        Ok(Signals { got })
    }

    /// The exit code (128+n) once a signal stopped the run, with its one line on stderr.
    fn stopped(&self) -> Option<u8> {
        let s = self.got.load(std::sync::atomic::Ordering::SeqCst);
        (s != 0).then(|| {
            eprintln!(
                "voidbox: stopped by {}; the VM was killed",
                crate::sandbox::error::signal_name(s)
            );
            128u8.saturating_add(s as u8)
        })
    }
}

/// `network: 3 connection attempts denied`.
fn denied_summary(d: &[voidbox_net::Denial]) -> String {
    let n = crate::network::denial_total(d);
    format!(
        "network: {n} connection attempt{} denied",
        if n == 1 { "" } else { "s" }
    )
}

/// Maps a guest exec result to a shell-style exit code; `timeout` is the limit the guest
/// enforced.
pub fn exit_code_of(program: &str, r: &ExecResponse, timeout: Timeout) -> u8 {
    if let Some(e) = &r.error {
        if r.exit_code == Some(EXIT_NOT_ALLOWED) {
            eprintln!("voidbox: {program}: refused by the guest policy: {e}");
        } else {
            eprintln!("voidbox: cannot run {program}: {e}");
        }
        return r.exit_code.map_or(127, |c| (c & 0xff) as u8);
    }
    if r.timed_out {
        eprintln!(
            "voidbox: {program}: timed out: {timeout} fired (after {} ms)",
            r.duration_ms
        );
        return 124;
    }
    if r.output_truncated {
        eprintln!("voidbox: output beyond the guest's limit was dropped");
    }
    match (r.exit_code, r.signal) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => 128u8.saturating_add((s & 0x7f) as u8),
        (None, None) => 125,
    }
}

fn kept_console_path() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("voidbox-console-{secs}-{}.log", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let t = Timeout::flag(Some(5));
        let r = |exit_code, signal, timed_out| ExecResponse {
            exit_code,
            signal,
            timed_out,
            ..ExecResponse::default()
        };
        assert_eq!(exit_code_of("x", &r(Some(7), None, false), t), 7);
        assert_eq!(exit_code_of("x", &r(Some(256 + 3), None, false), t), 3);
        assert_eq!(exit_code_of("x", &r(None, Some(9), false), t), 137);
        assert_eq!(exit_code_of("x", &r(None, Some(9), true), t), 124);
        let e = ExecResponse {
            error: Some("not found".into()),
            exit_code: Some(127),
            ..ExecResponse::default()
        };
        assert_eq!(exit_code_of("x", &e, t), 127);
        let refused = ExecResponse {
            error: Some("program `x` is not in the command allowlist (allowed: sh)".into()),
            exit_code: Some(EXIT_NOT_ALLOWED),
            ..ExecResponse::default()
        };
        assert_eq!(exit_code_of("x", &refused, t), 126);
    }

    #[test]
    fn parses_trailing_command() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct T {
            #[command(flatten)]
            a: RunArgs,
        }
        let t =
            T::try_parse_from(["x", "--memory-mb", "128", "--", "sh", "-c", "echo hi"]).unwrap();
        assert_eq!(t.a.memory_mb, 128);
        assert_eq!(t.a.command, vec!["sh", "-c", "echo hi"]);
        let t = T::try_parse_from(["x", "ls", "-la"]).unwrap();
        assert_eq!(t.a.command, vec!["ls", "-la"]);
        // A flag before the command is voidbox's: a misspelt one is a usage error (with a
        // tip), not the program to start; after `--` anything is the command.
        let e = T::try_parse_from(["x", "--memory", "512", "--", "true"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--memory-mb"), "{e}");
        let t = T::try_parse_from(["x", "--", "-x", "--memory"]).unwrap();
        assert_eq!(t.a.command, ["-x", "--memory"]);
        assert!(T::try_parse_from(["x", "--vcpus", "0", "--", "ls"]).is_err());
        // The spec's limits, not the VMM's old ones.
        let t = T::try_parse_from(["x", "--memory-mb", "4096", "--vcpus", "32", "ls"]).unwrap();
        assert_eq!((t.a.memory_mb, t.a.vcpus), (4096, 32));
        assert!(T::try_parse_from(["x", "--memory-mb", "63", "ls"]).is_err());
        assert!(T::try_parse_from(["x", "--timeout", "86401", "ls"]).is_err());
        // Network flags come before the command; after it they are the command's.
        let t =
            T::try_parse_from(["x", "--allow-host-port", "11434", "curl", "--allow", "x"]).unwrap();
        assert_eq!(t.a.network.allow_host_ports, [11434]);
        assert_eq!(t.a.command, ["curl", "--allow", "x"]);
        let p = t.a.network.policy().unwrap().expect("network on");
        assert_eq!(p.allow_host_ports, [11434]);
        let t = T::try_parse_from(["x", "ls"]).unwrap();
        assert_eq!(t.a.network.policy().unwrap(), None);
        let e = T::try_parse_from(["x", "--allow", "10.0.0.1/8", "ls"]).unwrap_err();
        assert!(e.to_string().contains("did you mean `10.0.0.0/8`"), "{e}");
    }
}
