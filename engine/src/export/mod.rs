//! `voidbox export`: hands a plan to a distributed engine, one engine node per plan node,
//! each running `voidbox apply SPEC --node NAME` (the node runner,
//! [`crate::apply::node_runner`]) in its own micro-VM on a machine with `/dev/kvm`.
//!
//! [`argo`] writes an Argo Workflows `Workflow` or `WorkflowTemplate` (with the `ConfigMap`
//! carrying the spec), [`github`] a GitHub Actions workflow. Both come from one [`Export`]:
//! the nodes with engine-safe names, what each reads, the secrets each needs. What cannot be
//! carried to another machine is refused before anything is written ([`Export::new`]).

pub mod argo;
pub mod github;
pub mod yaml;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use petgraph::graph::NodeIndex;

use crate::apply::node_runner;
use crate::plan::{Action, Plan, PlanNode};
use crate::spec::model::{Provider, SkillEntry};

/// Memory of the voidbox process itself (engine, NAT, credential gateway) beside its VM, in
/// MiB: a command node's runner peaks at 17 MiB (`cargo bench --bench node_runner`); the rest
/// is headroom for an agent's gateway and the NAT's buffers.
pub const RUNNER_OVERHEAD_MB: u64 = 64;

/// `voidbox export` arguments.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The spec file.
    pub file: PathBuf,
    /// The engine.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Write to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The run's input, as `apply --input` takes it (inline JSON, or `@FILE` passed as it
    /// is), carried in the export to the nodes that take the run's input. Argo: in the
    /// run's ConfigMap. GitHub Actions: the default of the `input` dispatch input.
    #[arg(long, value_name = "JSON|@FILE")]
    pub input: Option<String>,
    /// Argo: the container image holding voidbox and its guest images (required).
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Argo: write a `Workflow` (default) or a `WorkflowTemplate`.
    #[arg(long, value_enum, default_value_t = ArgoKind::Workflow)]
    pub kind: ArgoKind,
    /// Argo: the extended resource that gives a pod `/dev/kvm`.
    #[arg(long, value_name = "NAME", default_value = "devices.kubevirt.io/kvm")]
    pub kvm_resource: String,
    /// Argo: give each pod `/dev/kvm` from the node by a hostPath volume in a privileged
    /// container instead of a device plugin's resource.
    #[arg(long)]
    pub privileged: bool,
    /// Argo: the Kubernetes Secret holding the API keys and copied environment variables
    /// (each under its variable's name).
    #[arg(long, value_name = "NAME", default_value = "voidbox")]
    pub secret: String,
    /// Argo: most nodes running at once (the workflow's `parallelism`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_parallel: Option<u32>,
    /// GitHub Actions: the repository whose releases carry voidbox (`OWNER/NAME`, required).
    #[arg(long, value_name = "OWNER/NAME")]
    pub voidbox_repo: Option<String>,
    /// GitHub Actions: the voidbox release to install (default: this voidbox's version).
    #[arg(long, value_name = "VERSION")]
    pub voidbox_version: Option<String>,
    /// GitHub Actions: the runner label of every job (a runner with KVM).
    #[arg(long, value_name = "LABEL", default_value = "ubuntu-latest")]
    pub runs_on: String,
    /// GitHub Actions: the spec's path in the repository (default: its path from the root
    /// of the git work tree it is in).
    #[arg(long, value_name = "PATH")]
    pub spec_path: Option<String>,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Argo Workflows.
    Argo,
    /// A GitHub Actions workflow.
    GithubActions,
}

/// The Argo resource written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArgoKind {
    /// A `Workflow` (submitted to run).
    Workflow,
    /// A `WorkflowTemplate` (stored, run by reference).
    WorkflowTemplate,
}

/// One plan node as an engine node.
#[derive(Debug, Clone)]
pub struct Task {
    /// The plan node.
    pub index: NodeIndex,
    /// Its name in the engine (unique; see [`engine_names`]).
    pub name: String,
    /// The engine names of the nodes whose results it reads ([`node_runner::sources`]),
    /// each with that node's plan name.
    pub reads: Vec<(String, String)>,
    /// The engine names of the nodes it waits for: its upstream nodes and its box inputs'
    /// producers ([`node_runner::sources`]).
    pub after: Vec<String>,
    /// Environment variables it needs from the engine's secrets.
    pub secrets: BTreeSet<String>,
    /// Memory to request: the guest's, the VMM's overhead and the runner's, in MiB.
    pub memory_mb: u64,
    /// A sidecar service: runs beside its dependents.
    pub sidecar: bool,
    /// It takes the run's input (`apply --input`): a root node of a pipeline or workflow.
    pub run_input: bool,
}

/// A plan ready to export.
#[derive(Debug)]
pub struct Export<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// One task per node, in declaration order.
    pub tasks: Vec<Task>,
    /// The engine name of the step that builds a merged final output (`apply
    /// --final-output`), when the plan's output is more than one node's.
    pub final_task: Option<String>,
}

/// Names an engine accepts: `[A-Za-z0-9-]` (other characters become one `-`), starting
/// with a letter, at most 60 bytes, unique regardless of case
/// (a clash gets `-2`, `-3`, …), none in `reserved`.
pub fn engine_names<'n>(
    names: impl IntoIterator<Item = &'n str>,
    reserved: &[&str],
) -> Vec<String> {
    // Compared case-insensitively: GitHub job ids are not case-sensitive.
    let mut taken: BTreeSet<String> = reserved.iter().map(|r| r.to_ascii_lowercase()).collect();
    names
        .into_iter()
        .map(|n| {
            let mut base = String::new();
            for c in n.chars() {
                let c = if c.is_ascii_alphanumeric() { c } else { '-' };
                if !(c == '-' && (base.is_empty() || base.ends_with('-'))) {
                    base.push(c);
                }
            }
            base = base.trim_end_matches('-').to_string();
            if !base.starts_with(|c: char| c.is_ascii_alphabetic()) {
                base = format!("n-{base}");
            }
            base.truncate(56);
            let base = base.trim_end_matches('-').to_string();
            let mut name = base.clone();
            let mut k = 2;
            while taken.contains(&name.to_ascii_lowercase()) {
                name = format!("{base}-{k}");
                k += 1;
            }
            taken.insert(name.to_ascii_lowercase());
            name
        })
        .collect()
}

/// The environment variables `node` needs from the engine's secrets: its agent's API key
/// variable, and every `sandbox.env` entry the spec leaves empty (copied from the host in a
/// local run).
fn secrets_of(node: &PlanNode) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = node
        .sandbox
        .env
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| k.clone())
        .collect();
    if let Action::Agent(a) = &node.action {
        if let Some(k) = crate::providers::key_var(&a.llm) {
            out.insert(k);
        }
    }
    out
}

/// Why `node` cannot run on another machine, if it cannot.
fn not_portable(plan: &Plan, idx: NodeIndex, format: Format) -> Option<String> {
    let node = &plan.graph[idx];
    if format == Format::Argo && node.name.contains("{{") {
        return Some("its name holds `{{`, which Argo would read as a template expression".into());
    }
    if matches!(node.action, Action::Shell) {
        return Some("an interactive sandbox (no `run`) has nothing for an engine to run".into());
    }
    let here = "names a path on this machine, which an engine's machine does not have";
    if let Some(m) = node.sandbox.mounts.first() {
        return Some(format!("`sandbox.mounts` ({}) {here}", m.host));
    }
    if node.sandbox.kernel.is_some() || node.sandbox.initramfs.is_some() {
        return Some(format!(
            "`sandbox.kernel`/`sandbox.initramfs` {here}; ship boot files as an OCI image (`sandbox.guest_image`)"
        ));
    }
    if node.sandbox.snapshot.is_some() {
        return Some(
            "`sandbox.snapshot` names a snapshot in this machine's cache; an engine's machine starts from the golden snapshot voidbox makes itself".into(),
        );
    }
    if let Action::Agent(a) = &node.action {
        if a.llm.provider == Provider::ClaudePersonal {
            return Some(
                "`provider: claude-personal` uses the Claude login of this machine; use `provider: claude` with an API key in a secret".into(),
            );
        }
        if let Some(f) = a.skills.iter().find_map(|s| match s {
            SkillEntry::Simple(v) if v.starts_with("file:") => Some(v.clone()),
            _ => None,
        }) {
            return Some(format!(
                "the skill `{f}` {here}; publish it as an OCI skill or a `remote:` skill"
            ));
        }
        if let Some(p) = a.prompt_files.first() {
            return Some(format!("the prompt file {} {here}", p.display()));
        }
    }
    if plan.is_sidecar(idx) {
        if format == Format::GithubActions {
            return Some(
                "it is a `mode: service` sidecar, and GitHub Actions jobs cannot reach one another; export to Argo (a daemon step), or run the spec with `voidbox apply` in one job".into(),
            );
        }
        if matches!(node.action, Action::Agent(_)) {
            return Some(
                "it is an agent service with dependents, whose ready output cannot be handed to other machines".into(),
            );
        }
    }
    None
}

impl<'a> Export<'a> {
    /// The tasks of `plan`, or every reason (one per node) it cannot be exported to
    /// `format`. `reserved` are names the format uses itself.
    pub fn new(
        plan: &'a Plan,
        format: Format,
        reserved: &[&str],
    ) -> Result<Export<'a>, Vec<String>> {
        let problems: Vec<String> = plan
            .graph
            .node_indices()
            .filter_map(|i| {
                not_portable(plan, i, format)
                    .map(|why| format!("node `{}`: {why}", plan.graph[i].name))
            })
            .collect();
        if !problems.is_empty() {
            return Err(problems);
        }
        let needs_final = !matches!(plan.output, crate::plan::Output::Node(_));
        let names = engine_names(plan.graph.node_weights().map(|n| n.name.as_str()), reserved);
        let final_task = needs_final.then(|| {
            let taken: Vec<&str> = reserved
                .iter()
                .copied()
                .chain(names.iter().map(String::as_str))
                .collect();
            engine_names(["final-output"], &taken).remove(0)
        });
        let name_of = |i: NodeIndex| names[i.index()].clone();
        let tasks = plan
            .graph
            .node_indices()
            .map(|idx| {
                let node = &plan.graph[idx];
                Task {
                    index: idx,
                    name: name_of(idx),
                    reads: node_runner::reads(plan, idx)
                        .into_iter()
                        .map(|s| (name_of(s), plan.graph[s].name.clone()))
                        .collect(),
                    after: node_runner::sources(plan, idx)
                        .into_iter()
                        .map(name_of)
                        .collect(),
                    secrets: secrets_of(node),
                    memory_mb: node.sandbox.memory_mb
                        + crate::apply::VM_OVERHEAD_MB
                        + RUNNER_OVERHEAD_MB,
                    sidecar: plan.is_sidecar(idx),
                    run_input: crate::scheduler::data::takes_run_input(plan, idx),
                }
            })
            .collect();
        Ok(Export {
            plan,
            tasks,
            final_task,
        })
    }

    /// The tasks whose outputs make the final output, with their plan names.
    pub fn final_reads(&self) -> Vec<(String, String)> {
        node_runner::final_nodes(self.plan)
            .into_iter()
            .map(|i| {
                (
                    self.tasks[i.index()].name.clone(),
                    self.plan.graph[i].name.clone(),
                )
            })
            .collect()
    }
}

/// `--input` read as `apply --input` reads it; `None` without it.
pub fn run_input(args: &ExportArgs) -> Result<Option<Vec<u8>>, Vec<String>> {
    args.input
        .as_deref()
        .map(crate::apply::parse_input)
        .transpose()
        .map_err(|e| vec![e])
}

/// The directory a node's results are unpacked into under the node runner's `--inputs`.
pub fn input_dir_name(plan_name: &str) -> String {
    crate::names::file_component(plan_name)
}

/// `voidbox export`: exit 0 with the document written, 1 for an invalid spec, 2 for a spec
/// that cannot run on the engine or bad arguments.
pub fn export_cmd(plan: &Plan, spec_text: &str, args: &ExportArgs) -> ExitCode {
    let doc = match args.format {
        Format::Argo => argo::export(plan, spec_text, args),
        Format::GithubActions => github::export(plan, args),
    };
    let text = match doc {
        Ok(t) => t,
        Err(problems) => {
            for p in &problems {
                eprintln!("error: {}: {p}", args.file.display());
            }
            return ExitCode::from(2);
        }
    };
    match &args.output {
        Some(path) => match std::fs::write(path, &text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing {}: {e}", path.display());
                ExitCode::from(2)
            }
        },
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests;
