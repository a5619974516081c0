//! `voidbox apply`: executes a [`Plan`] — every node in its own fresh micro-VM, data flowing
//! along the edges (docs/architecture.md §4), fan-out branches in parallel and merged as JSON
//! arrays.
//!
//! [`scheduler`] drives the DAG on tokio through an [`Executor`](scheduler::Executor)
//! ([`executor::VmExecutor`] for real VMs); [`data`] holds the merge and input rules; [`report`]
//! the summary table, JSON report and JUnit XML; [`agent`] the agent runtime and its
//! stream-json parser; [`policy`] the guest policy (allowlist, rlimits) each VM gets.
//!
//! Exit codes: 0 success, 1 the pipeline failed (a node failed or timed out, or the
//! pipeline timed out), 2 usage (bad `--input`, bad `VOIDBOX_DNS_UPSTREAMS`), 3 environment (no KVM, no guest image, an
//! LLM provider that cannot run here, a node that can never fit in memory), 128+n on signal n.

pub mod artifacts;
pub mod executor;
pub mod node_runner;
pub mod report;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::node::{oci_images as images, refusals};
use crate::output::ProgressMode;
use crate::plan::Plan;
use crate::sandbox::{check_kvm, GuestImage, VmmLauncher};
use crate::scheduler::progress::{Bars, Plain, Progress};
use crate::scheduler::{Abort, Executor, RunResult, SchedOptions};

/// Memory kept free for the host beyond the VMs' budget.
pub const HOST_MARGIN_MB: u64 = 512;
/// Per-VM memory beyond the guest RAM (VMM, page tables, buffers).
pub const VM_OVERHEAD_MB: u64 = 32;

/// What `--output` prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// The pipeline's final output (the summary goes to stderr).
    Human,
    /// The JSON report (version 1, documented in docs/cli.md).
    Json,
}

/// `apply` settings.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Input of the first stage.
    pub input: Option<Vec<u8>>,
    /// stdout format.
    pub output: OutputFormat,
    /// JUnit XML destination.
    pub junit: Option<PathBuf>,
    /// Most nodes at once (default: the host's cores).
    pub max_parallel: Option<usize>,
    /// Per-node output cap.
    pub max_output: u64,
    /// Boot deadline per VM.
    pub boot_timeout: Duration,
    /// Where console logs go (default: the state dir).
    pub logs_dir: Option<PathBuf>,
    /// First retry delay.
    pub retry_base: Duration,
    /// Restore VMs from golden snapshots (`false`: `--no-snapshot`, every VM cold-boots).
    pub snapshots: bool,
    /// The spec's text, for refusing (with field and line) what `apply` cannot carry out.
    /// Without it only the LLM providers are checked.
    pub spec: Option<Arc<refusals::SpecSource>>,
    /// `--trace FILE`: the run's spans as OTLP JSON.
    pub trace_file: Option<PathBuf>,
    /// Connect to every model endpoint before anything starts ([`crate::node::reachable`]); `false`:
    /// `--no-endpoint-check`.
    pub endpoint_check: bool,
    /// A node runner's (`--node`) results directory: box outputs are collected into it, and
    /// `output` and `report.json` are written there when the run ends.
    pub outputs_dir: Option<PathBuf>,
    /// A node runner's input, built from outputs made elsewhere
    /// ([`node_runner::prepare`]).
    pub given_input: Option<crate::scheduler::data::NodeInput>,
    /// A node runner's box inputs: artifact name → directory.
    pub given_artifacts: std::collections::HashMap<String, PathBuf>,
    /// A node runner's services on other machines.
    pub across: Option<node_runner::Across>,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            input: None,
            output: OutputFormat::Human,
            junit: None,
            max_parallel: None,
            max_output: crate::capped::DEFAULT_MAX_OUTPUT,
            boot_timeout: Duration::from_secs(300),
            logs_dir: None,
            retry_base: Duration::from_secs(1),
            snapshots: true,
            spec: None,
            trace_file: None,
            endpoint_check: true,
            outputs_dir: None,
            given_input: None,
            given_artifacts: std::collections::HashMap::new(),
            across: None,
        }
    }
}

/// `MemAvailable` from `/proc/meminfo`, in MiB.
pub fn mem_available_mb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The memory budget for running VMs (MiB), and an error for a node that can never fit.
pub fn memory_budget(plan: &Plan, available_mb: u64) -> Result<u64, String> {
    let budget = available_mb.saturating_sub(HOST_MARGIN_MB);
    for n in plan.graph.node_weights() {
        let need = n.sandbox.memory_mb + VM_OVERHEAD_MB;
        if need > budget {
            return Err(format!(
                "node `{}` needs {} MiB ({} MiB guest + {VM_OVERHEAD_MB} MiB overhead) but only {budget} MiB are available for VMs ({available_mb} MiB available minus a {HOST_MARGIN_MB} MiB margin)",
                n.name, need, n.sandbox.memory_mb
            ));
        }
    }
    Ok(budget)
}

fn default_logs_dir(plan: &Plan) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    base.join("voidbox/runs").join(format!(
        "{}-{ms}-{}",
        crate::names::file_component(&plan.name),
        std::process::id()
    ))
}

/// Runs `plan` with the real VM executor, printing progress, summary and reports.
/// Returns the exit code.
pub fn apply(plan: Plan, opts: &ApplyOptions) -> u8 {
    if let Some(msg) = refusals::nothing_to_run(&plan) {
        eprintln!("{msg}");
        return 2;
    }
    let prepared = match crate::node::prepare::prepare(
        &plan,
        &crate::node::prepare::Checks {
            spec: opts.spec.as_deref(),
            purpose: crate::node::prepare::Purpose::Run,
            endpoint_check: opts.endpoint_check,
            trace_file: opts.trace_file.clone(),
        },
    ) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Err(e) = check_kvm() {
        eprintln!("error: {e}");
        return 3;
    }
    let budget = match mem_available_mb().map(|m| memory_budget(&plan, m)) {
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return 3;
        }
        None => u64::MAX,
    };
    let mut progress: Arc<dyn Progress> = if std::io::stderr().is_terminal() {
        Arc::new(Bars::new())
    } else {
        Arc::new(Plain::new())
    };
    if let Some(dir) = &opts.outputs_dir {
        progress = Arc::new(node_runner::ReadyFile {
            inner: progress,
            path: dir.join("ready"),
        });
    }
    // The run's span opens here, so preparation (images, runtimes) is part of the trace.
    let observer =
        match crate::observe::Observer::start(prepared.observe.clone(), &plan, progress.clone()) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}");
                return 3;
            }
        };
    let progress: Arc<dyn Progress> = match &observer {
        Some(o) => o.clone(),
        None => progress,
    };
    let code = apply_prepared(plan, prepared, opts, budget, progress, observer.as_deref());
    match observer {
        Some(o) => crate::observe::close(o, code),
        None => code,
    }
}

/// Everything from the guest image on.
fn apply_prepared(
    plan: Plan,
    prepared: crate::node::prepare::Prepared,
    opts: &ApplyOptions,
    budget: u64,
    progress: Arc<dyn Progress>,
    observer: Option<&crate::observe::Observer>,
) -> u8 {
    let crate::node::prepare::Prepared {
        endpoints,
        remotes,
        dns_upstreams,
        ..
    } = prepared;
    let image = match GuestImage::ensure(ProgressMode::Auto) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return 3;
        }
    };
    if let Some(src) = &opts.spec {
        if let Err(code) = crate::node::prepare::check_image(&plan, src, &image, opts.snapshots) {
            return code;
        }
    }
    // Every OCI image, kernel and initramfs is fetched and checked before any VM starts.
    let node_vms = match images::prepare(&plan, &image, opts.spec.as_deref(), ProgressMode::Auto) {
        Ok(m) => m,
        Err(Ok(r)) => {
            if let Some(src) = &opts.spec {
                eprint!("{}", refusals::render(src, &r));
            }
            return refusals::EXIT_REFUSED;
        }
        Err(Err(msg)) => {
            eprintln!("error: {msg}");
            return 3;
        }
    };
    let mut node_vms = node_vms;
    if let Err(code) = attach_runtimes(&plan, &endpoints, &mut node_vms) {
        return code;
    }
    let logs_dir = opts
        .logs_dir
        .clone()
        .unwrap_or_else(|| default_logs_dir(&plan));
    if let Err(e) = std::fs::create_dir_all(&logs_dir) {
        eprintln!("error: creating {}: {e}", logs_dir.display());
        return 3;
    }
    crate::sandbox::rundir::sweep_at_start();
    let runtime_dir = match crate::sandbox::rundir::RunDir::create("voidbox-apply-") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: creating a runtime directory: {e}");
            return 3;
        }
    };
    // Tempdirs are made 0700: only this user reaches the services' sockets in it.
    let services =
        crate::network::services::ServiceNet::new(&plan, runtime_dir.path()).and_then(|mut s| {
            match &opts.across {
                Some(a) => s
                    .across_machines(&a.full, a.node, &a.addrs, a.listen)
                    .map(|()| s),
                None => Ok(s),
            }
        });
    let services = match services {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return 3;
        }
    };
    let notice_to = progress.clone();
    let snapshots = match crate::snapshot::Snapshots::new(
        opts.snapshots,
        crate::snapshot::CreateOptions {
            launcher: VmmLauncher::default(),
            boot_timeout: opts.boot_timeout,
            runtime_dir: Some(runtime_dir.path().to_path_buf()),
        },
        plan.spec_dir.clone(),
        Arc::new(move |m: &str| notice_to.notice(m)),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    for vm in node_vms.values() {
        for n in &vm.notices {
            progress.notice(n);
        }
    }
    let artifacts_dir = opts.outputs_dir.clone().unwrap_or_else(|| logs_dir.clone());
    let exec = Arc::new(executor::VmExecutor {
        image,
        node_vms,
        launcher: VmmLauncher::default(),
        boot_timeout: opts.boot_timeout,
        logs_dir,
        artifacts_dir,
        given_artifacts: opts.given_artifacts.clone(),
        runtime_dir: Some(runtime_dir.path().to_path_buf()),
        spec_dir: plan.spec_dir.clone(),
        remotes: remotes.clone(),
        kill_children_on_abort: true,
        snapshots,
        dns_upstreams,
        endpoints,
        guest_telemetry: observer.is_some_and(|o| o.wants_guest_telemetry()),
        telemetry_buffer: plan
            .observe
            .as_ref()
            .and_then(|o| o.telemetry_buffer_size)
            .map_or(executor::DEFAULT_TELEMETRY_BUFFER, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
        services,
        warm_runtimes: true,
    });
    let sched = SchedOptions {
        max_parallel: opts
            .max_parallel
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1),
        memory_budget_mb: budget,
        vm_overhead_mb: VM_OVERHEAD_MB,
        max_output: opts.max_output,
        retry_base: opts.retry_base,
        run_input: opts.input.clone(),
        given_input: opts.given_input.clone(),
    };
    let plan = Arc::new(plan);
    if let Some(o) = observer {
        o.scheduling();
    }
    let result = match run_with_signals(plan.clone(), exec, sched, progress.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return 3;
        }
    };
    progress.finish();
    drop(runtime_dir);
    let code = finish(&plan, &remotes, &result, opts);
    if let Some(o) = observer {
        o.end_run(&plan, &result, code);
    }
    code
}

/// The runtimes disk (the real agent CLIs, fetched from npm once) on every agent node that
/// runs a real runtime and every command node that runs a runtime program
/// ([`crate::node::command_runtimes`]); the exit code when it cannot be had or does not fit
/// a VM.
fn attach_runtimes(
    plan: &Plan,
    endpoints: &std::collections::HashMap<String, crate::providers::Endpoint>,
    node_vms: &mut std::collections::HashMap<String, images::NodeVm>,
) -> Result<(), u8> {
    let agents = endpoints
        .iter()
        .filter(|(_, e)| e.runtime != crate::providers::Runtime::Mock)
        .map(|(name, _)| name.clone());
    let commands = plan
        .graph
        .node_weights()
        .filter(|n| !crate::node::command_runtimes::of(n).is_empty())
        .map(|n| n.name.clone());
    let nodes: Vec<String> = agents.chain(commands).collect();
    if nodes.is_empty() {
        return Ok(());
    }
    let disk = crate::runtimes::ensure(&mut |l| eprintln!("runtimes: {l}")).map_err(|e| {
        eprintln!("error: {e}");
        e.exit_code()
    })?;
    for name in nodes {
        let vm = node_vms.entry(name.clone()).or_default();
        vm.disks.images.push(disk.image_disk());
        if let Err(e) = vm.disks.check() {
            eprintln!("error: node `{name}`: {e}");
            return Err(3);
        }
    }
    Ok(())
}

/// Runs the scheduler on a fresh tokio runtime; SIGINT / SIGTERM abort the run.
pub fn run_with_signals(
    plan: Arc<Plan>,
    exec: Arc<dyn Executor>,
    sched: SchedOptions,
    progress: Arc<dyn Progress>,
) -> std::io::Result<RunResult> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (tx, rx) = watch::channel(None::<Abort>);
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            let sig = tokio::select! {
                _ = int.recv() => libc::SIGINT,
                _ = term.recv() => libc::SIGTERM,
            };
            let _ = tx.send(Some(Abort::Signal(sig)));
            // Keep the handlers installed (a second Ctrl-C must not kill us mid-cleanup).
            loop {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
        });
        Ok(crate::scheduler::run_plan(plan, exec, sched, progress, rx).await)
    })
}

/// Exit code of a finished run.
pub fn exit_code(r: &RunResult) -> u8 {
    match r.abort {
        Some(Abort::Signal(s)) => 128u8.saturating_add(s as u8),
        _ if r.success() => 0,
        _ if r.environment_failure() => 3,
        _ => 1,
    }
}

/// Prints the summary (stderr), the output or JSON report (stdout), writes JUnit; returns
/// the exit code.
pub fn finish(
    plan: &Plan,
    remotes: &crate::kit::Remotes,
    r: &RunResult,
    opts: &ApplyOptions,
) -> u8 {
    let mut code = exit_code(r);
    eprint!("{}", report::summary_table(plan, r));
    if let Some(Abort::Signal(s)) = r.abort {
        eprintln!(
            "voidbox: stopped by {}; every VM was killed",
            crate::sandbox::error::signal_name(s)
        );
    }
    if let Some(path) = &opts.junit {
        if let Err(e) = std::fs::write(path, report::junit(plan, r)) {
            eprintln!("error: writing {}: {e}", path.display());
            if code == 0 {
                code = 2;
            }
        }
    }
    if let Some(dir) = &opts.outputs_dir {
        if let Err(e) = write_results(dir, plan, remotes, r, code) {
            eprintln!("error: {e}");
            if code == 0 {
                code = 2;
            }
        }
    }
    let mut out = std::io::stdout().lock();
    match opts.output {
        OutputFormat::Json => {
            let doc = report::json_report(plan, remotes, r, code);
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&doc).unwrap_or_default()
            );
        }
        OutputFormat::Human => {
            if let Some(o) = &r.output {
                let _ = out.write_all(o);
                // On a terminal the prompt must not stick to `…,2]`; a redirected stdout stays
                // byte-exact.
                if !o.is_empty() && !o.ends_with(b"\n") && std::io::stdout().is_terminal() {
                    let _ = out.write_all(b"\n");
                }
            }
        }
    }
    let _ = out.flush();
    code
}

/// A node runner's results: `output` (when the node succeeded) and `report.json` in `dir`.
fn write_results(
    dir: &std::path::Path,
    plan: &Plan,
    remotes: &crate::kit::Remotes,
    r: &RunResult,
    code: u8,
) -> Result<(), String> {
    let write = |name: &str, data: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| format!("writing {}: {e}", path.display()))
    };
    if let Some(o) = &r.output {
        write("output", o)?;
    }
    let doc = report::json_report(plan, remotes, r, code);
    let mut text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    text.push(b'\n');
    write("report.json", &text)
}

/// Parses `--input`: inline JSON or `@file` (whose contents are passed as they are).
pub fn parse_input(arg: &str) -> Result<Vec<u8>, String> {
    if let Some(path) = arg.strip_prefix('@') {
        return std::fs::read(path).map_err(|e| format!("--input {arg}: {e}"));
    }
    serde_json::from_str::<serde_json::Value>(arg)
        .map_err(|e| format!("--input is not valid JSON ({e}); use @FILE for a file"))?;
    Ok(arg.as_bytes().to_vec())
}

#[cfg(test)]
mod tests;
