//! `voidbox export --format argo`: an Argo Workflows `Workflow` (or `WorkflowTemplate`) with
//! one DAG task per plan node, and the `ConfigMap` that carries the spec.
//!
//! - Each task is a container template running `voidbox apply /voidbox/spec/spec.yaml --node
//!   NAME --inputs /voidbox/inputs --outputs /voidbox/outputs` in `--image`. The spec comes
//!   from the ConfigMap (mounted read-only), never from the submitter's disk; a ConfigMap's
//!   contents are not template-expanded by Argo, so `{{…}}` in a prompt stays as written.
//! - A task's `/voidbox/outputs` is its output artifact `results` (the cluster's default
//!   artifact repository), unpacked into `/voidbox/inputs/<node>/` of every task that reads
//!   it. A merged final output is one more task, `voidbox apply --final-output`.
//! - `/dev/kvm` comes from a device plugin's extended resource (`--kvm-resource`, KubeVirt's
//!   by default) or, with `--privileged`, a hostPath device in a privileged container.
//!   Memory request and limit: the guest's `memory_mb`, the VMM's overhead and the runner's;
//!   CPU request: the node's vCPUs.
//! - `retries` → `retryStrategy` (`OnError`: the runner already retried the node's failures
//!   itself; Argo retries a pod lost to the cluster), `timeout_secs` → the template's
//!   `activeDeadlineSeconds` (over every attempt and boot) and the pipeline's to the
//!   workflow's, `on_failure` → the DAG's `failFast`, `--max-parallel` → `parallelism`.
//! - API keys and copied environment variables come from the Secret `--secret` by
//!   `secretKeyRef`, never as literals.
//! - A sidecar service is a `daemon: true` task, ready when its runner says so (a readiness
//!   probe on `/voidbox/outputs/ready`); its dependents reach it at `{{tasks.NAME.ip}}`.
//! - Every task shares `VOIDBOX_RUN_ID={{workflow.uid}}`, so their spans form one trace.

use serde_json::{json, Map, Value};

use super::{input_dir_name, yaml, ArgoKind, Export, ExportArgs, Format, Task};
use crate::plan::Plan;
use crate::spec::model::OnFailure;

/// Where the ConfigMap's spec is mounted.
const SPEC_DIR: &str = "/voidbox/spec";
/// The spec file in it.
const SPEC_FILE: &str = "/voidbox/spec/spec.yaml";
/// The node runner's `--inputs`.
const INPUTS: &str = "/voidbox/inputs";
/// The node runner's `--outputs` (the `results` artifact).
const OUTPUTS: &str = "/voidbox/outputs";
/// The DAG template's name.
const DAG: &str = "voidbox";
/// Seconds allowed beyond the node's own limits per attempt: the VM's boot and the OCI
/// images' pull.
const ATTEMPT_MARGIN_SECS: u64 = 600;
/// The longest backoff between attempts ([`crate::scheduler::backoff`]'s cap).
const MAX_BACKOFF_SECS: u64 = 30;

/// The ConfigMap's and the resources' name: `voidbox-<spec>-<8 hex of the spec's SHA-256>`.
fn config_map_name(plan: &Plan, spec_text: &str) -> String {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(spec_text.as_bytes()));
    let base = super::engine_names([plan.name.as_str()], &[])
        .remove(0)
        .to_ascii_lowercase();
    format!("voidbox-{}-{}", &base[..base.len().min(40)], &hash[..8])
}

/// A Kubernetes label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The Argo documents for `plan`: the ConfigMap, then the Workflow or WorkflowTemplate.
pub fn export(plan: &Plan, spec_text: &str, args: &ExportArgs) -> Result<String, Vec<String>> {
    let Some(image) = args.image.as_deref().filter(|i| !i.trim().is_empty()) else {
        return Err(vec![
            "--format argo needs --image REF: the container image holding voidbox and its guest images".into(),
        ]);
    };
    let ex = Export::new(plan, Format::Argo, &[DAG])?;
    let cm = config_map_name(plan, spec_text);
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": cm,
            "labels": labels(plan),
        },
        "data": {"spec.yaml": spec_text},
    });
    let mut templates = vec![dag_template(&ex)];
    templates.extend(ex.tasks.iter().map(|t| node_template(&ex, t, image, args)));
    if let Some(f) = &ex.final_task {
        templates.push(final_template(&ex, f, image));
    }
    let mut volumes = vec![json!({"name": "voidbox-spec", "configMap": {"name": cm}})];
    if args.privileged {
        volumes
            .push(json!({"name": "kvm", "hostPath": {"path": "/dev/kvm", "type": "CharDevice"}}));
    }
    let mut spec = Map::new();
    spec.insert("entrypoint".into(), json!(DAG));
    if let Some(n) = args.max_parallel {
        spec.insert("parallelism".into(), json!(n));
    }
    if let Some(t) = plan.timeout_secs {
        spec.insert("activeDeadlineSeconds".into(), json!(t));
    }
    spec.insert("volumes".into(), Value::Array(volumes));
    spec.insert("templates".into(), Value::Array(templates));
    let mut metadata = Map::new();
    match args.kind {
        ArgoKind::Workflow => {
            metadata.insert("generateName".into(), json!(format!("{cm}-")));
        }
        ArgoKind::WorkflowTemplate => {
            metadata.insert("name".into(), json!(cm));
        }
    }
    metadata.insert("labels".into(), labels(plan));
    let workflow = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": match args.kind {
            ArgoKind::Workflow => "Workflow",
            ArgoKind::WorkflowTemplate => "WorkflowTemplate",
        },
        "metadata": metadata,
        "spec": spec,
    });
    Ok(format!(
        "# Generated by `voidbox export --format argo` from `{}` ({} nodes). Apply both documents:\n# kubectl create -f THIS.yaml (the ConfigMap carries the spec; the {} runs it).\n{}---\n{}",
        plan.name,
        plan.graph.node_count(),
        match args.kind {
            ArgoKind::Workflow => "Workflow",
            ArgoKind::WorkflowTemplate => "WorkflowTemplate",
        },
        yaml::to_string(&config_map),
        yaml::to_string(&workflow)
    ))
}

fn labels(plan: &Plan) -> Value {
    json!({
        "app.kubernetes.io/managed-by": "voidbox",
        "voidbox.dev/spec": label_value(&plan.name),
    })
}

/// The DAG: one task per node, waiting for its upstream nodes, reading their results.
fn dag_template(ex: &Export) -> Value {
    let mut tasks: Vec<Value> = ex
        .tasks
        .iter()
        .map(|t| {
            let mut task = Map::new();
            task.insert("name".into(), json!(t.name));
            task.insert("template".into(), json!(t.name));
            if !t.after.is_empty() {
                task.insert("depends".into(), json!(t.after.join(" && ")));
            }
            if !t.reads.is_empty() {
                task.insert(
                    "arguments".into(),
                    json!({"artifacts": reads_from(&t.reads)}),
                );
            }
            Value::Object(task)
        })
        .collect();
    if let Some(f) = &ex.final_task {
        let reads = ex.final_reads();
        let after: Vec<&str> = reads.iter().map(|(n, _)| n.as_str()).collect();
        tasks.push(json!({
            "name": f,
            "template": f,
            "depends": after.join(" && "),
            "arguments": {"artifacts": reads_from(&reads)},
        }));
    }
    json!({
        "name": DAG,
        "dag": {
            "failFast": ex.plan.on_failure == OnFailure::FailFast,
            "tasks": tasks,
        },
    })
}

fn reads_from(reads: &[(String, String)]) -> Vec<Value> {
    reads
        .iter()
        .map(|(task, _)| {
            json!({"name": task, "from": format!("{{{{tasks.{task}.outputs.artifacts.results}}}}")})
        })
        .collect()
}

/// The input artifacts of a template reading `reads`, unpacked where the runner looks.
fn input_artifacts(reads: &[(String, String)]) -> Value {
    let arts: Vec<Value> = reads
        .iter()
        .map(|(task, plan_name)| {
            json!({"name": task, "path": format!("{INPUTS}/{}", input_dir_name(plan_name))})
        })
        .collect();
    json!({"artifacts": arts})
}

fn results_artifact() -> Value {
    json!({"artifacts": [{"name": "results", "path": OUTPUTS}]})
}

/// One node's container template.
fn node_template(ex: &Export, t: &Task, image: &str, args: &ExportArgs) -> Value {
    let node = &ex.plan.graph[t.index];
    let mut cli = vec![
        "apply".to_string(),
        SPEC_FILE.into(),
        "--node".into(),
        node.name.clone(),
    ];
    if !t.reads.is_empty() {
        cli.extend(["--inputs".into(), INPUTS.into()]);
    }
    cli.extend([
        "--outputs".into(),
        OUTPUTS.into(),
        "--logs-dir".into(),
        format!("{OUTPUTS}/logs"),
    ]);
    if !t.sidecar {
        cli.extend(["--junit".into(), format!("{OUTPUTS}/junit.xml")]);
    }
    for (svc, name) in services_of(ex, t) {
        cli.extend(["--service".into(), format!("{name}={{{{tasks.{svc}.ip}}}}")]);
    }
    // Only a sidecar with ports is reached (its runner refuses `--service-listen` without).
    if t.sidecar && node.service.as_ref().is_some_and(|s| !s.ports.is_empty()) {
        cli.extend(["--service-listen".into(), "0.0.0.0".into()]);
    }
    let mut env = vec![json!({"name": "VOIDBOX_RUN_ID", "value": "{{workflow.uid}}"})];
    for k in &t.secrets {
        env.push(json!({
            "name": k,
            "valueFrom": {"secretKeyRef": {"name": args.secret, "key": k}},
        }));
    }
    let memory = format!("{}Mi", t.memory_mb);
    let mut requests = json!({"cpu": node.sandbox.vcpus.to_string(), "memory": memory});
    let mut limits = json!({"memory": memory});
    let mut mounts = vec![json!({"name": "voidbox-spec", "mountPath": SPEC_DIR, "readOnly": true})];
    let mut container = Map::new();
    container.insert("image".into(), json!(image));
    container.insert("command".into(), json!(["voidbox"]));
    container.insert("args".into(), json!(cli));
    container.insert("env".into(), Value::Array(env));
    if args.privileged {
        mounts.push(json!({"name": "kvm", "mountPath": "/dev/kvm"}));
        container.insert("securityContext".into(), json!({"privileged": true}));
    } else {
        requests[&args.kvm_resource] = json!("1");
        limits[&args.kvm_resource] = json!("1");
    }
    container.insert(
        "resources".into(),
        json!({"requests": requests, "limits": limits}),
    );
    container.insert("volumeMounts".into(), Value::Array(mounts));
    if t.sidecar {
        let svc = node.service.as_ref();
        let ports: Vec<Value> = svc
            .map(|s| {
                s.ports
                    .iter()
                    .map(|p| json!({"containerPort": p}))
                    .collect()
            })
            .unwrap_or_default();
        if !ports.is_empty() {
            container.insert("ports".into(), Value::Array(ports));
        }
        container.insert(
            "readinessProbe".into(),
            json!({
                "exec": {"command": ["test", "-e", format!("{OUTPUTS}/ready")]},
                "periodSeconds": 1,
                "failureThreshold": svc.map_or(300, |s| s.ready_timeout_secs.max(1)),
            }),
        );
    }
    let mut tpl = Map::new();
    tpl.insert("name".into(), json!(t.name));
    if !t.reads.is_empty() {
        tpl.insert("inputs".into(), input_artifacts(&t.reads));
    }
    if t.sidecar {
        tpl.insert("daemon".into(), json!(true));
    } else {
        tpl.insert("outputs".into(), results_artifact());
        if node.retries > 0 {
            tpl.insert(
                "retryStrategy".into(),
                json!({"limit": node.retries.to_string(), "retryPolicy": "OnError"}),
            );
        }
        let attempts = u64::from(node.retries) + 1;
        let deadline = attempts * (node.timeout().secs + ATTEMPT_MARGIN_SECS)
            + u64::from(node.retries) * MAX_BACKOFF_SECS;
        tpl.insert("activeDeadlineSeconds".into(), json!(deadline.to_string()));
    }
    tpl.insert("container".into(), Value::Object(container));
    Value::Object(tpl)
}

/// The sidecars with ports `t` reaches: (their task name, their plan name).
fn services_of<'e>(ex: &'e Export, t: &Task) -> Vec<(&'e str, &'e str)> {
    crate::network::services::reached_services(ex.plan, t.index)
        .into_iter()
        .map(|s| {
            (
                ex.tasks[s.index()].name.as_str(),
                ex.plan.graph[s].name.as_str(),
            )
        })
        .collect()
}

/// The task that merges the final nodes' outputs (`apply --final-output`, no VM).
fn final_template(ex: &Export, name: &str, image: &str) -> Value {
    let reads = ex.final_reads();
    json!({
        "name": name,
        "inputs": input_artifacts(&reads),
        "outputs": results_artifact(),
        "container": {
            "image": image,
            "command": ["voidbox"],
            "args": ["apply", SPEC_FILE, "--final-output", "--inputs", INPUTS, "--outputs", OUTPUTS],
            "volumeMounts": [{"name": "voidbox-spec", "mountPath": SPEC_DIR, "readOnly": true}],
        },
    })
}
