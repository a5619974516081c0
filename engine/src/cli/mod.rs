//! Command-line interface (clap). Exit codes follow the CLI contract: 0 success, 1 invalid
//! spec / failed pipeline, 2 usage or I/O error, 3 environment (no KVM, no guest image).

pub mod image;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::diagnostic::FileReport;
use crate::plan::render::{render, GraphFormat};
use crate::plan::Plan;
use crate::spec::model::SandboxMode;
use crate::validate::{io_reason, validate_file_with, HostFacts, Validated};

/// voidbox — declarative pipelines, every node in a fresh KVM micro-VM.
#[derive(Debug, Parser)]
#[command(name = "voidbox", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate spec files, or directories searched recursively for *.yaml / *.yml.
    Validate(ValidateArgs),
    /// Render the stage DAG of a spec.
    Graph(GraphArgs),
    /// Print the JSON Schema of the spec language.
    Schema,
    /// Serve the language server protocol on stdin/stdout (diagnostics as `validate`
    /// reports them, hover, completion, go-to-definition, symbols) for an editor.
    Lsp,
    /// Run a spec (`--dry-run` prints the plan without running anything).
    #[command(after_help = apply_after_help())]
    Apply(ApplyArgs),
    /// Write a spec as a distributed engine's workflow (Argo Workflows, GitHub Actions): one
    /// engine node per plan node, each running `voidbox apply SPEC --node NAME`.
    Export(crate::export::ExportArgs),
    /// Stage every agent box's skills kit (secrets redacted) and report it per skill.
    Skills(crate::kit::cli::SkillsArgs),
    /// Check this host for what voidbox needs (KVM, guest image, disk, memory, host tools).
    Doctor(crate::doctor::DoctorArgs),
    /// Manage the guest image (kernel + system disk).
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Manage the read-only runtimes disk (Claude Code, Codex) that agent VMs mount.
    #[command(subcommand)]
    Runtimes(crate::runtimes::cli::RuntimesCommand),
    /// Manage golden snapshots (VMs restore from them instead of cold-booting).
    #[command(subcommand)]
    Snapshot(crate::snapshot::cli::SnapshotCommand),
    /// Run one command in a fresh micro-VM (`voidbox run -- CMD [ARGS…]`).
    Run(crate::run::RunArgs),
    /// An interactive terminal in a fresh micro-VM (`voidbox shell [SPEC]`).
    Shell(crate::shell::ShellArgs),
    /// Pull an OCI image into the cache and convert it to a read-only erofs disk.
    Pull(crate::oci::cli::PullArgs),
    /// Manage the OCI image cache.
    #[command(subcommand)]
    Oci(crate::oci::cli::OciCommand),
    /// Internal: run the VMM for one VM in this process (started by the engine).
    #[command(name = "__vmm", hide = true)]
    Vmm {
        /// VMM arguments (`--config-fd`, `--status-fd`, `--parent-pid`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `voidbox validate` arguments.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Spec files or directories (default: the current directory).
    pub paths: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Human)]
    pub format: ReportFormat,
    /// Skip named files that are not voidbox specs too, as a directory walk does (for hooks
    /// that pass every staged YAML file).
    #[arg(long)]
    pub only_specs: bool,
    /// Name each YAML file skipped as not a voidbox spec (on stderr).
    #[arg(long, short)]
    pub verbose: bool,
}

/// Diagnostic output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// Source snippets with labels and help (miette).
    Human,
    /// One JSON document with every diagnostic.
    Json,
    /// GitHub Actions annotations (`::error file=…,line=…,col=…::…`).
    Github,
}

/// `voidbox graph` arguments.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The spec file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
    pub format: GraphFormat,
}

/// `voidbox apply` arguments.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The spec file.
    pub file: PathBuf,
    /// Print the plan and exit without starting any VM.
    #[arg(long)]
    pub dry_run: bool,
    /// Input of the first stage: inline JSON, or `@FILE`.
    #[arg(long, value_name = "JSON|@FILE")]
    pub input: Option<String>,
    /// What stdout carries: the pipeline's output (human) or the JSON report (json); with
    /// `--dry-run`, the plan as text or as JSON.
    #[arg(long, value_enum, default_value_t = crate::apply::OutputFormat::Human)]
    pub output: crate::apply::OutputFormat,
    /// Write a JUnit XML report (one testcase per node) to PATH.
    #[arg(long, value_name = "PATH")]
    pub junit: Option<PathBuf>,
    /// Most nodes running at once (default: the number of cores; memory also limits it).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_parallel: Option<u32>,
    /// Per-node output cap (e.g. 16MiB); a larger output fails the node.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = crate::units::parse_size)]
    pub max_output: u64,
    /// Seconds to wait for each VM's guest agent to come up.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub boot_timeout: u64,
    /// Directory for the guest console logs (default: $XDG_STATE_HOME/voidbox/runs/…).
    #[arg(long, value_name = "DIR")]
    pub logs_dir: Option<PathBuf>,
    /// Cold-boot every VM instead of restoring it from a golden snapshot (also ignores
    /// `sandbox.snapshot`).
    #[arg(long)]
    pub no_snapshot: bool,
    /// Write the run's trace to FILE as OTLP JSON (with or without an OTLP collector).
    #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
    pub trace: Option<PathBuf>,
    /// Do not connect to the agents' model endpoints before starting (by default an
    /// unreachable one is refused, exit 3): for an endpoint that comes up during the run.
    #[arg(long)]
    pub no_endpoint_check: bool,
    /// Run only this node, in its own VM (a node runner, for a distributed engine: see
    /// `voidbox export`); its upstream results come from `--inputs`, its own go to
    /// `--outputs` (with `--dry-run`: print that node's plan, checking its inputs).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// With `--node` or `--final-output`: the upstream nodes' results, one directory per node
    /// (`DIR/<node>/output`, `DIR/<node>/artifacts/<name>/`).
    #[arg(long, value_name = "DIR")]
    pub inputs: Option<PathBuf>,
    /// With `--node` or `--final-output`: a new or empty directory receiving `output`,
    /// `artifacts/` and `report.json`.
    #[arg(long, value_name = "DIR")]
    pub outputs: Option<PathBuf>,
    /// With `--node`: the address of the runner of a `mode: service` node this node depends
    /// on (`NAME=IP`; repeatable); its ports are reached there.
    #[arg(long, value_name = "NAME=IP", requires = "node", value_parser = crate::apply::node_runner::parse_service)]
    pub service: Vec<(String, std::net::IpAddr)>,
    /// With `--node` of a `mode: service` node with `ports`: also accept its dependents'
    /// connections on IP:PORT for each port (e.g. 0.0.0.0 in an engine's pod).
    #[arg(long, value_name = "IP", requires = "node")]
    pub service_listen: Option<std::net::IpAddr>,
    /// Build the run's final output from the final nodes' results under `--inputs` into
    /// `--outputs DIR/output`, as a whole `apply` would print it (no VM starts).
    #[arg(long, requires_all = ["inputs", "outputs"], conflicts_with_all = ["node", "dry_run", "trace", "junit"])]
    pub final_output: bool,
}

/// The limits `voidbox apply --help` documents after the options.
fn apply_after_help() -> String {
    use crate::limits::{DEFAULT_NODE_TIMEOUT_SECS, MAX_TIMEOUT_SECS};
    format!(
        "Timeouts: a node without `timeout_secs` gets the default node timeout, \
         {DEFAULT_NODE_TIMEOUT_SECS} s; `timeout_secs` (node or pipeline) may be 1..={MAX_TIMEOUT_SECS}. \
         The guest kills the command when its limit fires, and the host kills the VM 5 s later \
         if it is still running. Reports name the limit that fired and its value."
    )
}

/// Exit status when stdout or stderr is a pipe whose reader has gone (`voidbox image ls |
/// head -1`): 0, as ripgrep does. The reader stopped on purpose, so under `set -o pipefail`
/// (GitHub Actions' bash) such a pipeline must not fail; git's 141 comes from being killed by
/// SIGPIPE, which a process that exits by itself cannot reproduce faithfully.
pub const EXIT_BROKEN_PIPE: u8 = 0;

/// Whether a panic payload is the standard library's "failed printing to stdout: Broken pipe"
/// (`print!` and friends panic when the write fails; Rust ignores SIGPIPE, so a closed pipe
/// is an `EPIPE` error rather than a signal).
pub fn is_broken_pipe_panic(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    (msg.starts_with("failed printing to stdout") || msg.starts_with("failed printing to stderr"))
        && (msg.contains("Broken pipe") || msg.contains("os error 32"))
}

/// Makes every command exit quietly with [`EXIT_BROKEN_PIPE`] when its output pipe is closed,
/// instead of panicking with exit code 101 (for the whole binary, every thread; any other
/// panic is reported as before).
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_broken_pipe_panic(info.payload()) {
            std::process::exit(i32::from(EXIT_BROKEN_PIPE));
        }
        default(info);
    }));
}

/// Entry point of the `voidbox` binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Not in the VMM child: its own failures must reach the engine as failures.
    if !matches!(cli.command, Command::Vmm { .. }) {
        exit_quietly_on_broken_pipe();
    }
    match cli.command {
        Command::Validate(args) => validate_cmd(&args),
        Command::Graph(args) => graph_cmd(&args),
        Command::Schema => {
            print!("{}", crate::spec::schema::schema_json());
            ExitCode::SUCCESS
        }
        Command::Apply(args) => apply_cmd(&args),
        Command::Export(args) => match load_plan_and_source(&args.file, 1) {
            Ok((plan, text)) => crate::export::export_cmd(&plan, &text, &args),
            Err(code) => code,
        },
        Command::Skills(args) => match load_plan(&args.file, 1) {
            Ok(plan) => crate::kit::cli::skills_cmd(&plan, &args),
            Err(code) => code,
        },
        Command::Doctor(args) => crate::doctor::doctor_cmd(&args),
        Command::Image(cmd) => image::run_cli(cmd),
        Command::Runtimes(cmd) => crate::runtimes::cli::run_cli(cmd),
        Command::Snapshot(cmd) => crate::snapshot::cli::run_cli(cmd),
        Command::Run(args) => crate::run::run_cmd(&args),
        Command::Shell(args) => {
            let spec = args.spec.as_deref().map(|f| {
                let (plan, text) = load_plan_and_source(f, 2)?;
                let mut src = spec_source(f, &text)?;
                src.command = "shell";
                Ok((plan, src))
            });
            match spec.transpose() {
                Ok(spec) => crate::shell::shell_cmd(&args, spec),
                Err(code) => code,
            }
        }
        Command::Pull(args) => crate::oci::cli::pull_cmd(&args),
        Command::Oci(cmd) => crate::oci::cli::run_cli(cmd),
        Command::Vmm { args } => crate::sandbox::vmm_process::run_vmm_mode(args),
        Command::Lsp => match voidbox_lsp::run_stdio(host_facts()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: voidbox lsp: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn color_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

fn color_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// The files `validate` checks, and the YAML files it skipped as not voidbox specs.
#[derive(Debug, Default)]
pub struct SpecFiles {
    /// Files to validate.
    pub files: Vec<PathBuf>,
    /// YAML files that are not specs ([`looks_like_spec`](crate::spec::yaml::looks_like_spec)).
    pub skipped: Vec<PathBuf>,
}

/// Expands the given paths into spec files (directories recursively, sorted, hidden
/// directories skipped). YAML found by a directory walk that is not a voidbox spec is skipped;
/// a file named explicitly is always checked unless `only_specs`. Errors are I/O problems
/// with a path, or a directory without specs.
pub fn collect_spec_files(paths: &[PathBuf], only_specs: bool) -> Result<SpecFiles, String> {
    let mut out = SpecFiles::default();
    // Only a regular file within the spec size limit is read (a FIFO would block, a huge file
    // would be read whole); anything else, or a file that cannot be read, is kept: validating
    // it reports the problem.
    let keep = |out: &mut SpecFiles, path: PathBuf| {
        use crate::validate::{read_capped, MAX_SPEC_BYTES};
        let readable =
            std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= MAX_SPEC_BYTES);
        let src = readable
            .then(|| read_capped(&path, MAX_SPEC_BYTES).ok())
            .flatten()
            .and_then(|b| String::from_utf8(b).ok());
        match src {
            Some(src) if !crate::spec::yaml::looks_like_spec(&src) => out.skipped.push(path),
            _ => out.files.push(path),
        }
    };
    for p in paths {
        let meta =
            std::fs::metadata(p).map_err(|e| format!("{}: {}", p.display(), io_reason(&e)))?;
        if !meta.is_dir() {
            if only_specs {
                keep(&mut out, p.clone());
            } else {
                out.files.push(p.clone());
            }
            continue;
        }
        let (before, skipped_before) = (out.files.len(), out.skipped.len());
        let walker = walkdir::WalkDir::new(p)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| {
                e.depth() == 0
                    || !(e.file_type().is_dir() && e.file_name().to_string_lossy().starts_with('.'))
            });
        for entry in walker {
            let entry = entry.map_err(|e| {
                let path = e
                    .path()
                    .map_or_else(|| p.display().to_string(), |x| x.display().to_string());
                let reason = e.io_error().map_or_else(|| e.to_string(), io_reason);
                format!("{path}: {reason}")
            })?;
            let is_yaml = entry
                .path()
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml");
            if entry.file_type().is_file() && is_yaml {
                keep(&mut out, entry.into_path());
            }
        }
        if out.files.len() == before {
            let skipped = out.skipped.len() - skipped_before;
            return Err(match skipped {
                0 => format!("{}: no *.yaml or *.yml spec files found", p.display()),
                n => format!(
                    "{}: no voidbox spec files found ({n} YAML file{} without `api_version`/`kind` skipped)",
                    p.display(),
                    if n == 1 { "" } else { "s" }
                ),
            });
        }
    }
    Ok(out)
}

fn validate_cmd(args: &ValidateArgs) -> ExitCode {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    let SpecFiles { files, skipped } = match collect_spec_files(&paths, args.only_specs) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.verbose {
        for f in &skipped {
            eprintln!(
                "skipped {}: not a voidbox spec (no `api_version`; no `kind`, or Kubernetes' `apiVersion`)",
                crate::diagnostic::visible(&f.display().to_string())
            );
        }
    }
    let mut reports: Vec<FileReport> = Vec::with_capacity(files.len());
    let mut io_errors = Vec::new();
    for f in &files {
        match validate_file_with(f, host_facts()) {
            Ok(Validated { report, .. }) => reports.push(report),
            Err(e) => io_errors.push(e.to_string()),
        }
    }
    let invalid = reports.iter().filter(|r| r.has_errors()).count();
    let errors: usize = reports
        .iter()
        .map(|r| r.diagnostics.iter().filter(|d| d.is_error()).count())
        .sum();
    let warnings: usize = reports
        .iter()
        .map(|r| r.diagnostics.iter().filter(|d| !d.is_error()).count())
        .sum();
    let mut out = std::io::stdout().lock();
    match args.format {
        ReportFormat::Human => {
            let color = color_stdout();
            for r in &reports {
                let _ = out.write_all(r.render_human(color).as_bytes());
            }
            let total = reports.len();
            let skipped = match skipped.len() {
                0 => String::new(),
                n if args.verbose => format!(" ({n} other YAML skipped)"),
                n => format!(" ({n} other YAML skipped; --verbose names them)"),
            };
            if invalid == 0 {
                let _ = writeln!(
                    out,
                    "{total} spec file{} valid{}{skipped}",
                    if total == 1 { "" } else { "s" },
                    plural_suffix(", ", warnings, "warning")
                );
            } else {
                let _ = writeln!(
                    out,
                    "{invalid} of {total} spec file{} invalid: {}{}{skipped}",
                    if total == 1 { "" } else { "s" },
                    plural_suffix("", errors, "error"),
                    plural_suffix(", ", warnings, "warning")
                );
            }
        }
        ReportFormat::Github => {
            for r in &reports {
                let _ = out.write_all(r.render_github().as_bytes());
            }
        }
        ReportFormat::Json => {
            let files: Vec<serde_json::Value> = reports
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "path": r.path,
                        "valid": !r.has_errors(),
                        "diagnostics": r.located().collect::<Vec<_>>(),
                    })
                })
                .collect();
            let doc = serde_json::json!({
                "files": files,
                "summary": {
                    "files": reports.len(),
                    "valid": reports.len() - invalid,
                    "invalid": invalid,
                    "errors": errors,
                    "warnings": warnings,
                    "io_errors": io_errors,
                    "skipped": skipped,
                }
            });
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&doc).unwrap_or_default()
            );
        }
    }
    for e in &io_errors {
        eprintln!("error: {e}");
    }
    if !io_errors.is_empty() {
        ExitCode::from(2)
    } else if invalid > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn plural_suffix(prefix: &str, n: usize, word: &str) -> String {
    match n {
        0 if !prefix.is_empty() => String::new(),
        1 => format!("{prefix}1 {word}"),
        n => format!("{prefix}{n} {word}s"),
    }
}

/// Loads, validates and compiles a spec for `graph` / `apply`; on failure prints diagnostics
/// to stderr and returns the exit code.
fn load_plan(file: &Path, invalid_code: u8) -> Result<Plan, ExitCode> {
    load_plan_and_source(file, invalid_code).map(|(plan, _)| plan)
}

/// What `validate`, `lsp`, `graph` and `apply` know of this host when validating: nothing, so
/// that a spec gets the same verdict on every machine (`apply` checks what depends on the
/// guest image once it has the image, [`crate::node::prepare::check_image`]).
fn host_facts() -> HostFacts<'static> {
    HostFacts::NONE
}

/// The spec's text parsed with spans, to refuse fields at their lines.
fn spec_source(file: &Path, text: &str) -> Result<crate::node::refusals::SpecSource, ExitCode> {
    crate::node::refusals::SpecSource::parse(file.display().to_string(), text).ok_or_else(|| {
        eprintln!(
            "error: {}: the spec changed while it was read",
            file.display()
        );
        ExitCode::from(2)
    })
}

/// [`load_plan`], also returning the spec's text.
fn load_plan_and_source(
    file: &Path,
    invalid_code: u8,
) -> Result<(Plan, std::sync::Arc<str>), ExitCode> {
    let v = match validate_file_with(file, host_facts()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(ExitCode::from(2));
        }
    };
    let color = color_stderr();
    if !v.report.diagnostics.is_empty() {
        eprint!("{}", v.report.render_human(color));
    }
    let Some(spec) = v.spec else {
        return Err(ExitCode::from(invalid_code));
    };
    let dir = std::fs::canonicalize(file)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let source = v.report.source.clone();
    Plan::compile(&spec, &dir)
        .map(|plan| (plan, source))
        .map_err(|e| {
            eprintln!("error: {}: {e}", file.display());
            ExitCode::from(invalid_code)
        })
}

fn graph_cmd(args: &GraphArgs) -> ExitCode {
    match load_plan(&args.file, 1) {
        Ok(plan) => {
            print!("{}", render(&plan, args.format));
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn apply_cmd(args: &ApplyArgs) -> ExitCode {
    let (plan, source) = match load_plan_and_source(&args.file, 2) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let src = match spec_source(&args.file, &source) {
        Ok(src) => std::sync::Arc::new(src),
        Err(code) => return code,
    };
    if (args.inputs.is_some() || args.outputs.is_some())
        && args.node.is_none()
        && !args.final_output
    {
        eprintln!("error: --inputs and --outputs go with --node NAME or --final-output");
        return ExitCode::from(2);
    }
    if args.final_output {
        return ExitCode::from(final_output_cmd(&plan, args));
    }
    if args.node.is_some() && args.outputs.is_none() && !args.dry_run {
        eprintln!(
            "error: --node NAME needs --outputs DIR (a new or empty directory for its results)"
        );
        return ExitCode::from(2);
    }
    let input = args.input.as_deref().map(crate::apply::parse_input);
    let input = match input.transpose() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (plan, job, across) = match &args.node {
        Some(name) => match node_job(&plan, name, input.as_deref(), args) {
            Ok((job, across)) => (job.plan, Some((job.input, job.artifacts)), Some(across)),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => (plan, None, None),
    };
    if args.dry_run {
        return ExitCode::from(dry_run(&plan, &src, args));
    }
    if let Some(dir) = args.outputs.as_deref() {
        if let Err(e) = crate::apply::node_runner::outputs_dir(dir) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    if plan.mode == SandboxMode::Mock {
        eprintln!(
            "error: {}: `sandbox.mode: mock` never runs anything, so `apply` refuses it\n  help: use `voidbox apply --dry-run {}` to see the plan, or set `mode: auto`",
            args.file.display(),
            args.file.display()
        );
        return ExitCode::from(2);
    }
    let (given_input, given_artifacts) = job.unzip();
    let opts = crate::apply::ApplyOptions {
        input,
        output: args.output,
        junit: args.junit.clone(),
        max_parallel: args.max_parallel.map(|n| n as usize),
        max_output: args.max_output,
        boot_timeout: std::time::Duration::from_secs(args.boot_timeout),
        logs_dir: args.logs_dir.clone(),
        snapshots: !args.no_snapshot,
        spec: Some(src),
        trace_file: args.trace.clone(),
        endpoint_check: !args.no_endpoint_check,
        outputs_dir: args.outputs.clone(),
        given_input,
        given_artifacts: given_artifacts.unwrap_or_default(),
        across,
        ..crate::apply::ApplyOptions::default()
    };
    ExitCode::from(crate::apply::apply(plan, &opts))
}

/// `apply --node NAME`: the node's job, built from `--inputs`, and its services on other
/// machines.
fn node_job(
    plan: &Plan,
    name: &str,
    input: Option<&[u8]>,
    args: &ApplyArgs,
) -> Result<
    (
        crate::apply::node_runner::NodeJob,
        crate::apply::node_runner::Across,
    ),
    String,
> {
    use crate::apply::node_runner;
    let idx = node_runner::find_node(plan, name)?;
    let across = node_runner::Across {
        full: plan.clone(),
        node: idx,
        addrs: args.service.clone(),
        listen: args.service_listen,
    };
    across.check()?;
    let job = node_runner::prepare(plan, idx, args.inputs.as_deref(), input, args.max_output)?;
    Ok((job, across))
}

/// `apply --final-output`: writes the run's final output from the final nodes' results.
fn final_output_cmd(plan: &Plan, args: &ApplyArgs) -> u8 {
    use crate::apply::node_runner;
    let (Some(inputs), Some(outputs)) = (args.inputs.as_deref(), args.outputs.as_deref()) else {
        return 2; // clap requires both
    };
    let result = node_runner::outputs_dir(outputs)
        .and_then(|()| node_runner::final_from(plan, inputs, args.max_output))
        .and_then(|bytes| {
            let path = outputs.join("output");
            std::fs::write(&path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
        });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// `apply --dry-run`: the refusals `apply` would make (same messages, same exit code), and a
/// bad `VOIDBOX_DNS_UPSTREAMS` when a node has network (exit 2), else the plan. Checks that
/// need the guest image run when it is cached; without it they are named as deferred.
fn dry_run(plan: &Plan, src: &crate::node::refusals::SpecSource, args: &ApplyArgs) -> u8 {
    let snapshots = !args.no_snapshot;
    use crate::node::refusals;
    if let Some(msg) = refusals::nothing_to_run(plan) {
        eprintln!("{msg}");
        return 2;
    }
    // The plan as `--output` asks: text, or the JSON plan (`graph --format json`).
    let plan_format = match args.output {
        crate::apply::OutputFormat::Human => GraphFormat::Text,
        crate::apply::OutputFormat::Json => GraphFormat::Json,
    };
    // The same checks as `apply`, printed the same way, with the same exit codes.
    if let Err(code) = crate::node::prepare::prepare(
        plan,
        &crate::node::prepare::Checks {
            spec: Some(src),
            purpose: crate::node::prepare::Purpose::Run,
            endpoint_check: !args.no_endpoint_check,
            trace_file: None,
        },
    ) {
        return code;
    }
    // `apply` itself needs /dev/kvm: the same finding and fix as `voidbox doctor`.
    if let Err(e) = crate::sandbox::check_kvm() {
        eprintln!("warning: `apply` cannot start VMs here: {e}");
    }
    match crate::sandbox::GuestImage::for_checks() {
        Ok(Some(image)) => {
            if let Err(code) = crate::node::prepare::check_image(plan, src, &image, snapshots) {
                return code;
            }
        }
        Ok(None) => eprintln!(
            "note: no guest image is cached yet, so `run.program`, `cli:` skills and `sandbox.snapshot` are checked when `apply` builds it"
        ),
        Err(e) => eprintln!(
            "note: `run.program`, `cli:` skills and `sandbox.snapshot` are checked when `apply` runs: the guest image cannot be looked up ({e})"
        ),
    }
    let starts = agent_starts(plan, snapshots);
    match plan_format {
        GraphFormat::Json if !starts.is_empty() => {
            // The JSON plan gets each agent node's runtime start.
            let mut doc: serde_json::Value =
                serde_json::from_str(&render(plan, plan_format)).unwrap_or_default();
            if let Some(o) = doc.as_object_mut() {
                let map: serde_json::Map<String, serde_json::Value> = starts
                    .iter()
                    .map(|(n, s)| {
                        let v = match s {
                            crate::scheduler::RuntimeStart::Cold { reason } => {
                                serde_json::json!({"start": "cold", "reason": reason})
                            }
                            crate::scheduler::RuntimeStart::Warm { .. } => {
                                serde_json::json!({"start": "warm"})
                            }
                        };
                        (n.clone(), v)
                    })
                    .collect();
                o.insert("agent_runtimes".into(), map.into());
            }
            println!("{doc:#}");
        }
        _ => {
            print!("{}", render(plan, plan_format));
            if !starts.is_empty() {
                println!("\nagent runtimes:");
                for (name, s) in &starts {
                    match s {
                        crate::scheduler::RuntimeStart::Cold { reason } => {
                            println!("  {name}: cold: {reason}")
                        }
                        crate::scheduler::RuntimeStart::Warm { .. } => println!(
                            "  {name}: warm (restored waiting for its prompt; its snapshot is made on first use)"
                        ),
                    }
                }
            }
        }
    }
    0
}

/// How each agent node's runtime would start (`apply --dry-run`): warm, or cold with the
/// reason ([`crate::node::warm_snapshot::cold_reason`]).
fn agent_starts(plan: &Plan, snapshots: bool) -> Vec<(String, crate::scheduler::RuntimeStart)> {
    let env = |k: &str| std::env::var(k).ok();
    plan.graph
        .node_weights()
        .filter_map(|n| {
            let crate::plan::Action::Agent(a) = &n.action else {
                return None;
            };
            let runtime = crate::providers::runtime_of(&a.llm, &env).ok()?;
            let start = match crate::node::warm_snapshot::cold_reason(n, runtime, snapshots) {
                Some(reason) => crate::scheduler::RuntimeStart::Cold { reason },
                None => crate::scheduler::RuntimeStart::Warm {
                    snapshot: String::new(),
                    created: false,
                },
            };
            Some((n.name.clone(), start))
        })
        .collect()
}
