//! `voidbox apply`: executes a [`Plan`] — every node in its own fresh micro-VM, data flowing
//! along the edges (design §4), fan-out branches in parallel and merged as JSON arrays.
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
pub mod report;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::node::{images, launch as runtime, reachable, refusals};
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
    /// The JSON report (version 1, documented in the README).
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
    /// Connect to every model endpoint before anything starts ([`reachable`]); `false`:
    /// `--no-endpoint-check`.
    pub endpoint_check: bool,
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

/// Fetches `plan`'s `remote:` skills into the cache ([`crate::kit::fetch_remotes`]) and
/// returns them (the kits are staged from them); a skill that cannot be fetched (offline, not found, refused) is
/// reported at its spec line when `spec` is known, and is exit 3 before any VM starts.
pub fn fetch_remotes(
    plan: &Plan,
    spec: Option<&refusals::SpecSource>,
) -> Result<crate::kit::Remotes, u8> {
    let failures = match crate::kit::fetch_remotes(plan, &|k| std::env::var(k).ok(), None) {
        Ok(r) => return Ok(r),
        Err(f) => f,
    };
    const HELP: &str = "check the network and the name, or pin a commit the cache holds (`remote:OWNER/REPO/SKILL@<commit>`); VOIDBOX_GITHUB_API_URL and GITHUB_TOKEN configure the source";
    match spec {
        Some(src) => {
            let r: Vec<refusals::Refusal> = failures
                .into_iter()
                .map(|f| {
                    refusals::locate(
                        plan,
                        src,
                        &f.node,
                        refusals::NodeField::Skill(f.index),
                        f.error.to_string(),
                        HELP,
                    )
                })
                .collect();
            eprint!("{}", refusals::render(src, &r));
        }
        None => {
            for f in failures {
                eprintln!("error: node `{}`: {}\n  help: {HELP}", f.node, f.error);
            }
        }
    }
    Err(refusals::EXIT_REFUSED)
}

/// Connects to every model endpoint of `endpoints` ([`reachable::check`]); on a failure
/// prints where each unreachable URL is set and returns [`refusals::EXIT_REFUSED`].
pub fn check_endpoints(
    plan: &Plan,
    spec: Option<&refusals::SpecSource>,
    endpoints: &HashMap<String, crate::providers::Endpoint>,
) -> Result<(), u8> {
    let env = |k: &str| std::env::var(k).ok();
    let down = reachable::check(plan, endpoints, &env);
    if down.is_empty() {
        return Ok(());
    }
    let help = "start it first (a local model: e.g. `scripts/local-model.sh start`), fix the URL, \
                or pass `--no-endpoint-check` if it comes up while the run starts";
    let mut r = Vec::new();
    for d in &down {
        let via = d
            .via
            .as_ref()
            .map_or(String::new(), |p| format!(" through the proxy {p}"));
        let message = format!("{} is unreachable{via}: {}", d.url, d.why);
        for node in &d.nodes {
            match (reachable::url_field(plan, node, &env), spec) {
                (reachable::UrlSource::Spec(field), Some(src)) => r.push(refusals::locate(
                    plan,
                    src,
                    node,
                    field,
                    message.clone(),
                    help,
                )),
                (reachable::UrlSource::Env(var), _) => {
                    eprintln!("error: node `{node}`: {var}: {message}\n  help: {help}")
                }
                (_, None) => eprintln!("error: node `{node}`: {message}\n  help: {help}"),
            }
        }
    }
    // Nodes sharing the spec's `llm.base_url` share one refusal.
    r.dedup_by(|a, b| (a.line, a.column, &a.message) == (b.line, b.column, &b.message));
    match spec.filter(|_| !r.is_empty()) {
        Some(src) => eprint!("{}", refusals::render(src, &r)),
        None => eprintln!("error: a model endpoint is unreachable; nothing was started"),
    }
    Err(refusals::EXIT_REFUSED)
}

/// Runs `plan` with the real VM executor, printing progress, summary and reports.
/// Returns the exit code.
pub fn apply(plan: Plan, opts: &ApplyOptions) -> u8 {
    if let Some(msg) = refusals::nothing_to_run(&plan) {
        eprintln!("{msg}");
        return 2;
    }
    if let Some(src) = &opts.spec {
        let r = refusals::check_spec(&plan, src);
        if !r.is_empty() {
            eprint!("{}", refusals::render(src, &r));
            return refusals::EXIT_REFUSED;
        }
    }
    // Where telemetry goes is settled (and a bad endpoint refused) before anything starts.
    let observe = match crate::observe::config::resolve(
        plan.observe.as_ref(),
        &|k| std::env::var(k).ok(),
        opts.trace_file.clone(),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    // Every agent's provider, key or login is checked before anything starts.
    let endpoints = match runtime::endpoints(&plan, &|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(failures) => {
            match &opts.spec {
                Some(src) => {
                    let r = runtime::endpoint_refusals(&plan, src, failures);
                    eprint!("{}", refusals::render(src, &r));
                }
                None => {
                    for f in failures {
                        eprintln!(
                            "error: node `{}`: {}\n  help: {}",
                            f.node, f.message, f.help
                        );
                    }
                }
            }
            return refusals::EXIT_REFUSED;
        }
    };
    if opts.endpoint_check {
        if let Err(code) = check_endpoints(&plan, opts.spec.as_deref(), &endpoints) {
            return code;
        }
    }
    let remotes = match fetch_remotes(&plan, opts.spec.as_deref()) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let dns_upstreams = match dns_upstreams(&plan) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
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
    let progress: Arc<dyn Progress> = if std::io::stderr().is_terminal() {
        Arc::new(Bars::new())
    } else {
        Arc::new(Plain::new())
    };
    // The run's span opens here, so preparation (images, runtimes) is part of the trace.
    let observer = match crate::observe::Observer::start(observe, &plan, progress.clone()) {
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
    let mut code = apply_prepared(
        plan,
        remotes,
        opts,
        endpoints,
        dns_upstreams,
        budget,
        progress,
        observer.as_deref(),
    );
    if let Some(o) = observer {
        o.end_early(code);
        let flushed = o.shutdown();
        if let Some(e) = &flushed.trace_file_error {
            eprintln!("error: --trace: {e}");
            if code == 0 {
                code = 2;
            }
        }
        // One warning per run: a flush cut short after failed exports was already said.
        if flushed.timed_out && flushed.export_failures == 0 {
            eprintln!(
                "voidbox: warning: the telemetry not sent within {}s of the run's end was dropped",
                crate::observe::config::FLUSH_BUDGET.as_secs()
            );
            // A provider whose export is stuck would block its drop (it joins its thread).
            std::mem::forget(o);
        }
    }
    code
}

/// Everything from the guest image on.
#[allow(clippy::too_many_arguments)]
fn apply_prepared(
    plan: Plan,
    remotes: crate::kit::Remotes,
    opts: &ApplyOptions,
    endpoints: std::collections::HashMap<String, crate::providers::Endpoint>,
    dns_upstreams: Vec<std::net::SocketAddr>,
    budget: u64,
    progress: Arc<dyn Progress>,
    observer: Option<&crate::observe::Observer>,
) -> u8 {
    let image = match GuestImage::ensure(ProgressMode::Auto) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return 3;
        }
    };
    if let Some(src) = &opts.spec {
        let r = image_refusals(&plan, src, &image, opts.snapshots);
        if !r.is_empty() {
            eprint!("{}", refusals::render(src, &r));
            return refusals::EXIT_REFUSED;
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
    if runtime::needs_runtimes(&endpoints) {
        // The real runtimes come on their own read-only disk (fetched from npm once).
        let disk = match crate::runtimes::ensure(&mut |l| eprintln!("runtimes: {l}")) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {e}");
                return e.exit_code();
            }
        };
        for (name, e) in &endpoints {
            if e.runtime == crate::providers::Runtime::Mock {
                continue;
            }
            let vm = node_vms.entry(name.clone()).or_default();
            vm.disks.images.push(disk.image_disk());
            if let Err(e) = vm.disks.check() {
                eprintln!("error: node `{name}`: {e}");
                return 3;
            }
        }
    }
    let logs_dir = opts
        .logs_dir
        .clone()
        .unwrap_or_else(|| default_logs_dir(&plan));
    if let Err(e) = std::fs::create_dir_all(&logs_dir) {
        eprintln!("error: creating {}: {e}", logs_dir.display());
        return 3;
    }
    let runtime_dir = match tempfile::Builder::new().prefix("voidbox-apply-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: creating a runtime directory: {e}");
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
    let exec = Arc::new(executor::VmExecutor {
        image,
        node_vms,
        launcher: VmmLauncher::default(),
        boot_timeout: opts.boot_timeout,
        logs_dir,
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

/// The refusals that depend on the guest image the nodes boot: `cli:` skills whose program
/// is not on its `PATH`, and spec-named snapshots that cannot restore their node (checked
/// only when `snapshots` is on; `--no-snapshot` ignores them).
pub fn image_refusals(
    plan: &Plan,
    src: &refusals::SpecSource,
    image: &GuestImage,
    snapshots: bool,
) -> Vec<refusals::Refusal> {
    let programs = image
        .vmlinux
        .parent()
        .and_then(crate::image::layout::image_path_programs);
    let store = snapshots
        .then(|| crate::snapshot::Store::open(None).ok())
        .flatten();
    let check = |n: &crate::plan::PlanNode, value: &str| -> Result<(), String> {
        let Some(store) = &store else { return Ok(()) };
        let mut cfg = crate::sandbox::SandboxConfig::new(image.clone());
        cfg.memory_mb = u32::try_from(n.sandbox.memory_mb).unwrap_or(u32::MAX);
        cfg.vcpus = u8::try_from(n.sandbox.vcpus).unwrap_or(u8::MAX);
        cfg.network = n
            .sandbox
            .network
            .clone()
            .map(|p| crate::network::nat_config(p, &[]));
        crate::snapshot::explicit(store, value, &plan.spec_dir, &cfg)
            .map(drop)
            .map_err(|e| match e {
                crate::sandbox::SandboxError::Environment(m) => m,
                e => e.to_string(),
            })
    };
    refusals::check_image(
        plan,
        src,
        &refusals::ImageFacts {
            path_programs: programs.as_ref(),
            snapshot: Some(&check),
        },
    )
}

/// The DNS upstreams of `VOIDBOX_DNS_UPSTREAMS` when a node of `plan` has network (an
/// invalid value is an error before any VM starts; without network it is not read).
pub fn dns_upstreams(plan: &Plan) -> Result<Vec<std::net::SocketAddr>, String> {
    if plan
        .graph
        .node_weights()
        .any(|n| n.sandbox.network.is_some())
    {
        crate::network::upstreams::from_env()
    } else {
        Ok(Vec::new())
    }
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
