//! `voidbox export --format github-actions`: a GitHub Actions workflow with one job per plan
//! node.
//!
//! - Each job opens `/dev/kvm` (a udev rule, as GitHub's larger runners need), installs
//!   voidbox from the release tarball of `--voidbox-repo`, restores `~/.cache/voidbox`
//!   (golden snapshots, OCI images) under a key made from the guest image's hash, downloads
//!   the results of the nodes it reads (`actions/download-artifact`) into `voidbox-inputs/`,
//!   runs `voidbox apply SPEC --node NAME --inputs voidbox-inputs --outputs voidbox-outputs
//!   --junit voidbox-outputs/junit.xml`, and uploads `voidbox-outputs/` (output, box
//!   outputs, report, JUnit, console logs) as the artifact `voidbox-<job>`.
//! - `needs` are the node's upstream nodes; `timeout-minutes` covers every attempt of the
//!   node with its boot; a merged final output is one more job (`apply --final-output`).
//! - `on_failure: continue` is GitHub's own behaviour (a failed job skips its dependents, the
//!   others go on, the run fails); under `fail_fast` a failing job cancels the run, as
//!   `apply` stops its other nodes. (`continue-on-error` would mark the run successful,
//!   which `apply` never does when a node failed.)
//! - API keys and copied environment variables come from `${{ secrets.NAME }}`.
//! - Every job shares `VOIDBOX_RUN_ID` (repository, run and attempt), so their spans form
//!   one trace.
//! - User text (node names, the spec's path) reaches the shell only through environment
//!   variables, and any `${{` in it is escaped, so it is never evaluated.

use serde_json::{json, Map, Value};

use super::{input_dir_name, yaml, Export, ExportArgs, Format, Task};
use crate::plan::Plan;
use crate::spec::model::OnFailure;

/// Where a job unpacks the results it reads.
const INPUTS: &str = "voidbox-inputs";
/// Where a job's results go (its uploaded artifact).
const OUTPUTS: &str = "voidbox-outputs";
/// Seconds allowed per attempt beyond the node's limit: boot and image pulls.
const ATTEMPT_MARGIN_SECS: u64 = 600;
/// The `workflow_dispatch` input carrying the run's input.
const INPUT: &str = "input";
/// Install, cache and artifact steps of one job.
const JOB_MARGIN_SECS: u64 = 600;

/// `s` with every `${{` escaped as GitHub documents it (`${{ '${{' }}`), so a workflow never
/// evaluates user text as an expression.
fn literal(s: &str) -> String {
    s.replace("${{", "${{ '${{' }}")
}

/// The GitHub Actions workflow for `plan`.
/// (The spec itself is in the repository: each job checks it out.)
pub fn export(plan: &Plan, args: &ExportArgs) -> Result<String, Vec<String>> {
    let Some(repo) = args.voidbox_repo.as_deref() else {
        return Err(vec![
            "--format github-actions needs --voidbox-repo OWNER/NAME: the repository whose releases carry voidbox".into(),
        ]);
    };
    if !repo_ok(repo) {
        return Err(vec![format!("--voidbox-repo {repo}: not OWNER/NAME")]);
    }
    let version = args
        .voidbox_version
        .clone()
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
    if !version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
    {
        return Err(vec![format!("--voidbox-version {version}: not a version")]);
    }
    let spec_path = match &args.spec_path {
        Some(p) => p.clone(),
        None => repo_relative(&args.file)?,
    };
    let input = super::run_input(args)?;
    let exported_input = match input {
        None => None,
        Some(bytes) => match String::from_utf8(bytes) {
            Ok(text) if !text.contains('\0') => Some(text),
            _ => {
                return Err(vec![
                    "--input: GitHub Actions passes the input in an environment variable, which holds UTF-8 text without NUL bytes only".into(),
                ])
            }
        },
    };
    let ex = Export::new(plan, Format::GithubActions, &[])?;
    let install = Install {
        repo,
        version: &version,
    };
    let mut jobs = Map::new();
    for t in &ex.tasks {
        jobs.insert(
            t.name.clone(),
            node_job(
                &ex,
                t,
                &install,
                &spec_path,
                args,
                exported_input.as_deref(),
            ),
        );
    }
    if let Some(f) = &ex.final_task {
        jobs.insert(f.clone(), final_job(&ex, &install, &spec_path, args));
    }
    let fail_fast = plan.on_failure == OnFailure::FailFast;
    let mut permissions = json!({"contents": "read"});
    if fail_fast {
        permissions["actions"] = json!("write");
    }
    let mut dispatch = json!({});
    if ex.tasks.iter().any(|t| t.run_input) {
        let default = if exported_input.is_some() {
            "the input given to `voidbox export --input`"
        } else {
            "none"
        };
        dispatch["inputs"] = json!({INPUT: {
            "description": format!("The run's input, inline JSON as `voidbox apply --input` takes it (empty: {default})"),
            "type": "string",
            "required": false,
            "default": "",
        }});
    }
    let workflow = json!({
        "name": literal(&format!("voidbox: {}", plan.name)),
        "on": {"workflow_dispatch": dispatch},
        "permissions": permissions,
        "jobs": jobs,
    });
    Ok(format!(
        "# Generated by `voidbox export --format github-actions` from `{}` ({} nodes).\n{}",
        plan.name.replace('\n', " "),
        plan.graph.node_count(),
        yaml::to_string(&workflow)
    ))
}

/// `OWNER/NAME` as GitHub spells repositories.
fn repo_ok(repo: &str) -> bool {
    let mut parts = repo.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The spec's path from the root of the git work tree holding it.
fn repo_relative(file: &std::path::Path) -> Result<String, Vec<String>> {
    let abs = std::fs::canonicalize(file).map_err(|e| vec![format!("{}: {e}", file.display())])?;
    let root = abs
        .ancestors()
        .skip(1)
        .find(|d| d.join(".git").exists())
        .ok_or_else(|| {
            vec![format!(
                "{}: not in a git work tree; say where the spec is in the repository with --spec-path PATH",
                file.display()
            )]
        })?;
    abs.strip_prefix(root)
        .ok()
        .and_then(|p| p.to_str())
        .map(str::to_string)
        .ok_or_else(|| vec![format!("{}: not a UTF-8 path", abs.display())])
}

struct Install<'a> {
    repo: &'a str,
    version: &'a str,
}

/// The steps every job starts with: checkout, KVM, voidbox, its cache.
fn setup_steps(install: &Install, kvm: bool) -> Vec<Value> {
    let tarball = format!("voidbox-{}-x86_64-linux.tar.gz", install.version);
    let mut steps = vec![json!({"uses": "actions/checkout@v5"})];
    if kvm {
        steps.push(json!({
            "name": "Let this job open /dev/kvm",
            "run": "echo 'KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0666\", OPTIONS+=\"static_node=kvm\"' \\\n  | sudo tee /etc/udev/rules.d/99-kvm4all.rules\nsudo udevadm control --reload-rules\nsudo udevadm trigger --name-match=kvm\n",
        }));
    }
    steps.push(json!({
        "name": format!("Install voidbox {}", install.version),
        "env": {"GH_TOKEN": "${{ github.token }}"},
        "run": format!(
            "gh release download 'v{v}' --repo '{r}' --pattern '{tarball}' --dir \"$RUNNER_TEMP\"\nmkdir -p \"$HOME/.local\"\ntar -xzf \"$RUNNER_TEMP/{tarball}\" -C \"$HOME/.local\" --strip-components=1\necho \"$HOME/.local/bin\" >> \"$GITHUB_PATH\"\n",
            v = install.version,
            r = install.repo,
        ),
    }));
    if kvm {
        steps.push(json!({
            "name": "Guest image hash",
            "id": "voidbox",
            "run": "hash=$(voidbox image probe --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"image\"][\"hash\"])')\necho \"image=$hash\" >> \"$GITHUB_OUTPUT\"\n",
        }));
        steps.push(json!({
            "uses": "actions/cache@v5",
            "with": {
                "path": "~/.cache/voidbox",
                "key": "voidbox-${{ runner.os }}-${{ steps.voidbox.outputs.image }}",
            },
        }));
    }
    steps
}

/// Download steps for the results of `reads`.
fn download_steps(reads: &[(String, String)]) -> Vec<Value> {
    reads
        .iter()
        .map(|(task, plan_name)| {
            json!({
                "uses": "actions/download-artifact@v7",
                "with": {
                    "name": format!("voidbox-{task}"),
                    "path": literal(&format!("{INPUTS}/{}", input_dir_name(plan_name))),
                },
            })
        })
        .collect()
}

fn upload_step(task: &str) -> Value {
    json!({
        "uses": "actions/upload-artifact@v6",
        "if": "always()",
        "with": {
            "name": format!("voidbox-{task}"),
            "path": format!("{OUTPUTS}/"),
            "if-no-files-found": "error",
        },
    })
}

fn job_header(
    name: &str,
    args: &ExportArgs,
    needs: &[String],
    timeout_secs: u64,
) -> Map<String, Value> {
    let mut job = Map::new();
    job.insert("name".into(), json!(literal(name)));
    job.insert("runs-on".into(), json!(literal(&args.runs_on)));
    if !needs.is_empty() {
        job.insert("needs".into(), json!(needs));
    }
    job.insert(
        "timeout-minutes".into(),
        json!((timeout_secs + JOB_MARGIN_SECS).div_ceil(60)),
    );
    job
}

/// One node's job.
fn node_job(
    ex: &Export,
    t: &Task,
    install: &Install,
    spec_path: &str,
    args: &ExportArgs,
    exported_input: Option<&str>,
) -> Value {
    let node = &ex.plan.graph[t.index];
    let attempts = u64::from(node.retries) + 1;
    let secs =
        attempts * (node.timeout().secs + ATTEMPT_MARGIN_SECS) + u64::from(node.retries) * 30;
    let mut job = job_header(&node.name, args, &t.after, secs);
    let mut steps = setup_steps(install, true);
    steps.extend(download_steps(&t.reads));
    let mut env = Map::new();
    env.insert("VOIDBOX_SPEC".into(), json!(literal(spec_path)));
    env.insert("VOIDBOX_NODE".into(), json!(literal(&node.name)));
    env.insert(
        "VOIDBOX_RUN_ID".into(),
        json!("${{ github.repository_id }}-${{ github.run_id }}-${{ github.run_attempt }}"),
    );
    for k in &t.secrets {
        env.insert(k.clone(), json!(format!("${{{{ secrets.{k} }}}}")));
    }
    let inputs = if t.reads.is_empty() {
        String::new()
    } else {
        format!(" --inputs {INPUTS}")
    };
    // A root node takes the run's input: the dispatch input when given (inline JSON, checked
    // as `apply --input` checks it), else the exported one (its bytes, through a file).
    let (set_input, input_args) = if t.run_input {
        env.insert(
            "VOIDBOX_INPUT".into(),
            json!(format!("${{{{ inputs.{INPUT} }}}}")),
        );
        let otherwise = match exported_input {
            Some(text) => {
                env.insert("VOIDBOX_EXPORTED_INPUT".into(), json!(literal(text)));
                "else\n  printf '%s' \"$VOIDBOX_EXPORTED_INPUT\" > \"$RUNNER_TEMP/voidbox-input\"\n  set -- --input \"@$RUNNER_TEMP/voidbox-input\"\n"
            }
            None => "",
        };
        (
            format!("set --\nif [ -n \"$VOIDBOX_INPUT\" ]; then\n  set -- --input \"$VOIDBOX_INPUT\"\n{otherwise}fi\n"),
            " \"$@\"",
        )
    } else {
        (String::new(), "")
    };
    steps.push(json!({
        "name": literal(&format!("voidbox apply --node {}", node.name)),
        "env": env,
        "run": format!(
            "{set_input}voidbox apply \"$VOIDBOX_SPEC\" --node \"$VOIDBOX_NODE\"{inputs}{input_args} --outputs {OUTPUTS} \\\n  --junit {OUTPUTS}/junit.xml --logs-dir {OUTPUTS}/logs\n"
        ),
    }));
    steps.push(upload_step(&t.name));
    if ex.plan.on_failure == OnFailure::FailFast {
        steps.push(cancel_step());
    }
    job.insert("steps".into(), Value::Array(steps));
    Value::Object(job)
}

/// Under fail-fast, a failed node stops the whole run, as `apply` does.
fn cancel_step() -> Value {
    json!({
        "name": "Fail fast: cancel the run",
        "if": "failure()",
        "env": {"GH_TOKEN": "${{ github.token }}"},
        "run": "gh run cancel \"$GITHUB_RUN_ID\" --repo \"$GITHUB_REPOSITORY\"\n",
    })
}

/// The job merging the final nodes' outputs (no VM, no KVM).
fn final_job(ex: &Export, install: &Install, spec_path: &str, args: &ExportArgs) -> Value {
    let reads = ex.final_reads();
    let needs: Vec<String> = reads.iter().map(|(t, _)| t.clone()).collect();
    let name = ex.final_task.clone().unwrap_or_default();
    let mut job = job_header(&name, args, &needs, 0);
    let mut steps = setup_steps(install, false);
    steps.extend(download_steps(&reads));
    steps.push(json!({
        "name": "voidbox apply --final-output",
        "env": {"VOIDBOX_SPEC": literal(spec_path)},
        "run": format!(
            "voidbox apply \"$VOIDBOX_SPEC\" --final-output --inputs {INPUTS} --outputs {OUTPUTS}\ncat {OUTPUTS}/output\n"
        ),
    }));
    steps.push(upload_step(&name));
    job.insert("steps".into(), Value::Array(steps));
    Value::Object(job)
}
