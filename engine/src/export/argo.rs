//! `voidbox export --format argo`: an Argo Workflows `Workflow` (or `WorkflowTemplate`) with
//! one DAG task per plan node, after a task that creates the run's `ConfigMap`.
//!
//! - The first task (`voidbox-spec`, a `resource` template with `setOwnerReference`) creates
//!   the ConfigMap `{{workflow.name}}-spec`, owned by the Workflow: one per submission (no
//!   AlreadyExists on a second one), deleted with the Workflow. It carries the spec and the
//!   run's input (`--input`) base64-encoded in `binaryData`, so Argo's `{{…}}` expansion of
//!   the manifest never touches them and a prompt's `{{…}}` stays as written.
//! - Each node task is a container template running `voidbox apply /voidbox/spec/spec.yaml
//!   --node NAME --inputs /voidbox/inputs --outputs /voidbox/outputs` in `--image`, with the
//!   ConfigMap mounted read-only at `/voidbox/spec`; a node taking the run's input (a root
//!   node) also gets `--input @/voidbox/spec/input` when the export carries one.
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
//!   probe on `/voidbox/outputs/ready`); its dependents reach it at `{{tasks.NAME.ip}}`. It
//!   listens on the pod's address, so a `NetworkPolicy` (made by a task before it, owned by
//!   the Workflow) admits only the pods of this run's nodes that reach it, on its ports: every
//!   node pod is labelled with the run (`voidbox.dev/workflow-uid`) and its task
//!   (`voidbox.dev/node`). A network plugin that does not enforce NetworkPolicy leaves the
//!   service open to every pod; the export's header says so.
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
/// The task (and template) creating the run's ConfigMap.
const SPEC_TASK: &str = "voidbox-spec";
/// The run's ConfigMap: one per Workflow, named after it.
const CONFIG_MAP_NAME: &str = "{{workflow.name}}-spec";
/// The ConfigMap's key holding the run's input (`--input`).
const INPUT_KEY: &str = "input";
/// Where a root node's runner reads the run's input.
const INPUT_FILE: &str = "/voidbox/spec/input";
/// Most base64 bytes the ConfigMap may carry: Kubernetes' 1 MiB, less room for its metadata.
const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024 - 4096;
/// The pod label naming the run (the Workflow's uid), which the NetworkPolicies select on.
const POD_RUN: &str = "voidbox.dev/workflow-uid";
/// The pod label naming the node's task.
const POD_NODE: &str = "voidbox.dev/node";
/// The run's id as Argo expands it.
const RUN_ID: &str = "{{workflow.uid}}";
/// Seconds allowed beyond the node's own limits per attempt: the VM's boot and the OCI
/// images' pull.
const ATTEMPT_MARGIN_SECS: u64 = 600;
/// The longest backoff between attempts ([`crate::scheduler::backoff`]'s cap).
const MAX_BACKOFF_SECS: u64 = 30;

/// The Workflow's (`generateName`) or WorkflowTemplate's name: `voidbox-<spec>-<8 hex of the
/// spec's SHA-256>`.
fn resource_name(plan: &Plan, spec_text: &str) -> String {
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

/// The Argo document for `plan`: the Workflow or WorkflowTemplate, whose first task makes
/// the run's ConfigMap and whose service tasks get their NetworkPolicy first.
pub fn export(plan: &Plan, spec_text: &str, args: &ExportArgs) -> Result<String, Vec<String>> {
    let Some(image) = args.image.as_deref().filter(|i| !i.trim().is_empty()) else {
        return Err(vec![
            "--format argo needs --image REF: the container image holding voidbox and its guest images".into(),
        ]);
    };
    let input = super::run_input(args)?;
    let ex = Export::new(plan, Format::Argo, &[DAG, SPEC_TASK])?;
    let cm = config_map(plan, spec_text, input.as_deref())?;
    let policies = policies(&ex);
    let mut templates = vec![dag_template(&ex, &policies)];
    templates.extend(
        ex.tasks
            .iter()
            .map(|t| node_template(&ex, t, image, args, input.is_some())),
    );
    if let Some(f) = &ex.final_task {
        templates.push(final_template(&ex, f, image));
    }
    templates.push(resource_template(SPEC_TASK, &cm));
    for p in &policies {
        templates.push(resource_template(&p.task, &p.manifest));
    }
    let mut volumes = vec![json!({"name": "voidbox-spec", "configMap": {"name": CONFIG_MAP_NAME}})];
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
    let name = resource_name(plan, spec_text);
    let mut metadata = Map::new();
    match args.kind {
        ArgoKind::Workflow => {
            metadata.insert("generateName".into(), json!(format!("{name}-")));
        }
        ArgoKind::WorkflowTemplate => {
            metadata.insert("name".into(), json!(name));
        }
    }
    metadata.insert("labels".into(), labels(plan));
    let kind = match args.kind {
        ArgoKind::Workflow => "Workflow",
        ArgoKind::WorkflowTemplate => "WorkflowTemplate",
    };
    let workflow = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": spec,
    });
    let isolation = if policies.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = policies.iter().map(|p| p.service.as_str()).collect();
        format!(
            "\n# Services ({}): each gets a NetworkPolicy admitting only the pods of this run's nodes that\n# reach it, on its ports. Your network plugin must enforce NetworkPolicy (Calico, Cilium, …);\n# without one any pod in the cluster can reach them.",
            names.join(", ")
        )
    };
    Ok(format!(
        "# Generated by `voidbox export --format argo` from `{}` ({} nodes).\n# Submit it: argo submit THIS.yaml (or kubectl create -f THIS.yaml{}).\n# Its first task creates the ConfigMap `<workflow>-spec` (the spec{}), owned by the\n# Workflow and deleted with it: the workflow's service account must be allowed to create\n# configmaps{}.{isolation}\n{}",
        plan.name.replace('\n', " "),
        plan.graph.node_count(),
        match args.kind {
            ArgoKind::Workflow => "",
            ArgoKind::WorkflowTemplate => ", then argo submit --from workflowtemplate/NAME",
        },
        if input.is_some() { " and the run's input" } else { "" },
        if policies.is_empty() { "" } else { " and networkpolicies" },
        yaml::to_string(&workflow)
    ))
}

/// The run's ConfigMap, created by the workflow's first task: the spec and the run's input,
/// base64-encoded (`binaryData`), so Argo's `{{…}}` expansion of the manifest never touches
/// them and any bytes pass unchanged.
fn config_map(plan: &Plan, spec_text: &str, input: Option<&[u8]>) -> Result<String, Vec<String>> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut data = Map::new();
    data.insert("spec.yaml".into(), json!(b64.encode(spec_text)));
    if let Some(i) = input {
        data.insert(INPUT_KEY.into(), json!(b64.encode(i)));
    }
    let size: usize = data.values().filter_map(Value::as_str).map(str::len).sum();
    if size > MAX_CONFIG_MAP_BYTES {
        return Err(vec![format!(
            "the spec and the run's input take {size} bytes in base64, over what a Kubernetes ConfigMap holds (1 MiB)"
        )]);
    }
    Ok(yaml::to_string(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP_NAME, "labels": labels(plan)},
        "binaryData": data,
    })))
}

/// A task template creating the object `manifest`, owned by the Workflow
/// (`setOwnerReference`): one per run, deleted with the Workflow.
fn resource_template(name: &str, manifest: &str) -> Value {
    json!({
        "name": name,
        "resource": {
            "action": "create",
            "setOwnerReference": true,
            "manifest": manifest,
        },
    })
}

/// A service's NetworkPolicy: its task, the task creating it, its manifest.
struct Policy {
    service: String,
    task: String,
    manifest: String,
}

/// One NetworkPolicy per sidecar service: its pod (this run's, by [`POD_RUN`] and
/// [`POD_NODE`]) admits TCP on its ports from the pods of the nodes that reach it
/// ([`services_of`]) and nothing else; a service reached by none admits nothing.
fn policies(ex: &Export) -> Vec<Policy> {
    let services: Vec<&Task> = ex.tasks.iter().filter(|t| t.sidecar).collect();
    let mut taken: Vec<&str> = vec![DAG, SPEC_TASK];
    taken.extend(ex.tasks.iter().map(|t| t.name.as_str()));
    taken.extend(ex.final_task.as_deref());
    let names = super::engine_names(
        services
            .iter()
            .map(|s| format!("{}-policy", s.name))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
        &taken,
    );
    services
        .iter()
        .zip(names)
        .map(|(svc, task)| {
            let ports = ex.plan.graph[svc.index]
                .service
                .as_ref()
                .map(|s| s.ports.clone())
                .unwrap_or_default();
            let dependents: Vec<&str> = ex
                .tasks
                .iter()
                .filter(|t| services_of(ex, t).iter().any(|(s, _)| *s == svc.name))
                .map(|t| t.name.as_str())
                .collect();
            let ingress = if ports.is_empty() || dependents.is_empty() {
                json!([])
            } else {
                json!([{
                    "from": [{"podSelector": {
                        "matchLabels": {POD_RUN: RUN_ID},
                        "matchExpressions": [{"key": POD_NODE, "operator": "In", "values": dependents}],
                    }}],
                    "ports": ports.iter().map(|p| json!({"protocol": "TCP", "port": p})).collect::<Vec<_>>(),
                }])
            };
            let manifest = yaml::to_string(&json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {
                    "name": format!("{{{{workflow.name}}}}-{}", svc.name.to_ascii_lowercase()),
                    "labels": labels(ex.plan),
                },
                "spec": {
                    "podSelector": {"matchLabels": {POD_RUN: RUN_ID, POD_NODE: svc.name}},
                    "policyTypes": ["Ingress"],
                    "ingress": ingress,
                },
            }));
            Policy {
                service: svc.name.clone(),
                task,
                manifest,
            }
        })
        .collect()
}

fn labels(plan: &Plan) -> Value {
    json!({
        "app.kubernetes.io/managed-by": "voidbox",
        "voidbox.dev/spec": label_value(&plan.name),
    })
}

/// The DAG: the ConfigMap's and the NetworkPolicies' tasks, then one task per node, after the
/// ConfigMap, its upstream nodes and (a service) its NetworkPolicy, reading their results.
fn dag_template(ex: &Export, policies: &[Policy]) -> Value {
    let mut tasks = vec![json!({"name": SPEC_TASK, "template": SPEC_TASK})];
    tasks.extend(
        policies
            .iter()
            .map(|p| json!({"name": p.task, "template": p.task})),
    );
    tasks.extend(ex.tasks.iter().map(|t| {
        let mut task = Map::new();
        task.insert("name".into(), json!(t.name));
        task.insert("template".into(), json!(t.name));
        let mut after = vec![SPEC_TASK];
        after.extend(
            policies
                .iter()
                .filter(|p| p.service == t.name)
                .map(|p| p.task.as_str()),
        );
        after.extend(t.after.iter().map(String::as_str));
        task.insert("depends".into(), json!(after.join(" && ")));
        if !t.reads.is_empty() {
            task.insert(
                "arguments".into(),
                json!({"artifacts": reads_from(&t.reads)}),
            );
        }
        Value::Object(task)
    }));
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
fn node_template(ex: &Export, t: &Task, image: &str, args: &ExportArgs, has_input: bool) -> Value {
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
    if t.run_input && has_input {
        cli.extend(["--input".into(), format!("@{INPUT_FILE}")]);
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
    // What the NetworkPolicies select: this run's pod of this node.
    tpl.insert(
        "metadata".into(),
        json!({"labels": {POD_RUN: RUN_ID, POD_NODE: t.name}}),
    );
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
