//! `voidbox export` checked against the engines' own definitions: every pipeline and workflow
//! of `examples/` and `specs/valid/` is exported to Argo Workflows and to GitHub Actions; the
//! Argo documents validate against Argo's published JSON Schema (vendored in
//! `tests/vendor/argo-workflows`) and load into hera's models (PyYAML, a YAML 1.1 reader);
//! the GitHub workflows validate against the schema check-jsonschema vendors
//! (`vendor.github-workflows`) and pass actionlint with no finding. Also the node runner's
//! usage errors, which stop before any VM (exit 2). No KVM needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use voidbox_tests::{repo_root, run_in, wheel_tool};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Every pipeline and workflow spec of the examples and the valid corpus.
fn specs() -> Vec<PathBuf> {
    let root = repo_root();
    let mut out = Vec::new();
    for dir in ["examples", "specs/valid"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            if text.contains("\nkind: pipeline") || text.contains("\nkind: workflow") {
                out.push(f);
            }
        }
    }
    assert!(out.len() >= 10, "too few specs found: {out:?}");
    out
}

/// Specs GitHub Actions cannot run, and why (`mode: service` sidecars).
const GITHUB_REFUSED: &[(&str, &str)] = &[
    (
        "ci-services.yaml",
        "node `api`: it is a `mode: service` sidecar",
    ),
    (
        "workflow-service-sidecar.yaml",
        "node `web`: it is a `mode: service` sidecar",
    ),
];

/// A run input with what engines could mistake for their own expressions.
const RUN_INPUT: &str = "{\"q\": \"${{ github.token }} {{workflow.uid}}\",\n \"n\": 1}\n";

fn export(spec: &Path, args: &[&str]) -> voidbox_tests::Run {
    let mut all = vec!["export", spec.to_str().unwrap()];
    all.extend_from_slice(args);
    run_in(VOIDBOX, &repo_root(), &all)
}

fn run_tool(tool: &Path, args: &[&str], files: &[PathBuf]) -> String {
    let out = Command::new(tool)
        .args(args)
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{text}",
        tool.display()
    );
    text
}

#[test]
fn argo_exports_validate_against_argos_schema_and_load_into_hera() {
    let dir = tempfile::tempdir().unwrap();
    let mut workflows = Vec::new();
    let mut docs = Vec::new();
    for (i, spec) in specs().iter().enumerate() {
        for kind in ["workflow", "workflow-template"] {
            let mut args = vec![
                "--format",
                "argo",
                "--image",
                "registry.example/voidbox:0.1.0",
                "--kind",
                kind,
            ];
            // The templates carry a run input (in the ConfigMap), the workflows none.
            if kind == "workflow-template" {
                args.extend(["--input", RUN_INPUT]);
            }
            let r = export(spec, &args);
            assert_eq!(r.code, Some(0), "{}: {}", spec.display(), r.stderr);
            assert!(!r.stdout.contains("\n---\n"), "one document");
            let wf = dir.path().join(format!("{i}-{kind}.yaml"));
            std::fs::write(&wf, &r.stdout).unwrap();
            workflows.push(wf.clone());
            docs.push((wf, spec.clone()));
        }
    }
    let schema = repo_root().join("tests/vendor/argo-workflows/schema.json");
    let out = run_tool(
        &wheel_tool("check-jsonschema"),
        &["--schemafile", schema.to_str().unwrap()],
        &workflows,
    );
    assert!(out.contains("ok -- validation done"), "{out}");
    // hera: the Workflow (or WorkflowTemplate) loads into its models; the ConfigMap its
    // first task creates, read by PyYAML, is owned by the Workflow, named after it, and
    // carries the spec byte for byte; each service's NetworkPolicy selects, once Argo has
    // expanded `{{workflow.uid}}`, exactly that service's pod, and admits exactly the pods of
    // the tasks reaching it (`--service NAME=…`) on its ports.
    let script = r#"
import sys, yaml, base64
from hera.workflows import Workflow, WorkflowTemplate
from hera.workflows import models
args = sys.argv[1:]
policies = 0
def matches(sel, labels):
    if any(labels.get(k) != v for k, v in sel.get("matchLabels", {}).items()):
        return False
    for e in sel.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True
for path, spec in zip(args[0::2], args[1::2]):
    [wf] = list(yaml.safe_load_all(open(path)))
    tpls = {t["name"]: t for t in wf["spec"]["templates"]}
    dag = wf["spec"]["templates"][0]["dag"]["tasks"]
    assert dag[0]["name"] == "voidbox-spec", path
    res = tpls["voidbox-spec"]["resource"]
    assert res["action"] == "create" and res["setOwnerReference"] is True, path
    cm = yaml.safe_load(res["manifest"])
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "{{workflow.name}}-spec", path
    assert wf["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"], path
    assert base64.b64decode(cm["binaryData"]["spec.yaml"]) == open(spec, "rb").read(), f"{path}: the spec changed on its way"
    uid = "0b5e4c1e-0000-4000-8000-000000000001"
    pods = {n: {k: v.replace("{{workflow.uid}}", uid) for k, v in t["metadata"]["labels"].items()}
            for n, t in tpls.items() if "container" in t and "metadata" in t}
    # Another run's pods of the same names: never selected.
    others = {n + "@other": {**l, "voidbox.dev/workflow-uid": "another"} for n, l in pods.items()}
    for n, t in tpls.items():
        if "resource" not in t or n == "voidbox-spec":
            continue
        np = yaml.safe_load(t["resource"]["manifest"].replace("{{workflow.uid}}", uid))
        assert np["kind"] == "NetworkPolicy" and np["spec"]["policyTypes"] == ["Ingress"], path
        assert t["resource"]["setOwnerReference"] is True, path
        selected = [p for p, l in {**pods, **others}.items() if matches(np["spec"]["podSelector"], l)]
        assert len(selected) == 1, (path, selected)
        svc = selected[0]
        c = tpls[svc]["container"]
        assert tpls[svc].get("daemon") is True, path
        reach = sorted(m for m, mt in tpls.items() if "container" in mt
                       and any(a.startswith(svc + "=") for a in mt["container"]["args"]))
        ports = sorted(p["containerPort"] for p in c.get("ports", []))
        if not np["spec"]["ingress"]:
            assert not reach or not ports, (path, svc, reach)
        else:
            [rule] = np["spec"]["ingress"]
            [peer] = rule["from"]
            admitted = sorted(p for p, l in {**pods, **others}.items() if matches(peer["podSelector"], l))
            assert admitted == reach, (path, svc, admitted, reach)
            assert sorted(p["port"] for p in rule["ports"]) == ports, path
            assert all(p["protocol"] == "TCP" for p in rule["ports"]), path
        deps = next(d for d in dag if d["name"] == svc)["depends"].split(" && ")
        assert n in deps, f"{path}: {svc} starts before its policy"
        policies += 1
    cls, model = (Workflow, models.Workflow) if wf["kind"] == "Workflow" else (WorkflowTemplate, models.WorkflowTemplate)
    w = cls.from_dict(wf)
    m = model.model_validate(wf)
    names = {t.name for t in m.spec.templates}
    for task in m.spec.templates[0].dag.tasks:
        assert task.template in names, f"{path}: task {task.name} names no template"
    assert len(w.templates) == len(wf["spec"]["templates"]), path
print(f"hera loaded {len(args) // 2} exports, {policies} network policies")
"#;
    let mut pairs = Vec::new();
    for (all, spec) in &docs {
        pairs.push(all.clone());
        pairs.push(spec.clone());
    }
    let out = run_tool(&wheel_tool("python"), &["-c", script], &pairs);
    assert!(
        out.contains(&format!("hera loaded {} exports", docs.len())),
        "{out}"
    );
    // The service examples (ci-services, workflow-service-sidecar) get their policies.
    assert!(!out.contains(" 0 network policies"), "{out}");
}

#[test]
fn github_exports_validate_against_the_workflow_schema_and_pass_actionlint() {
    let dir = tempfile::tempdir().unwrap();
    let wf_dir = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&wf_dir).unwrap();
    let mut files = Vec::new();
    for (i, spec) in specs().iter().enumerate() {
        let mut args = vec![
            "--format",
            "github-actions",
            "--voidbox-repo",
            "acme/voidbox",
        ];
        // Every other one carries a run input (the exported default of the dispatch input).
        if i % 2 == 1 {
            args.extend(["--input", RUN_INPUT]);
        }
        let r = export(spec, &args);
        let name = spec.file_name().unwrap().to_str().unwrap();
        if let Some((_, why)) = GITHUB_REFUSED.iter().find(|(f, _)| *f == name) {
            assert_eq!(r.code, Some(2), "{name}: {}", r.stdout);
            assert!(r.stderr.contains(why), "{name}: {}", r.stderr);
            assert!(r.stdout.is_empty());
            continue;
        }
        assert_eq!(r.code, Some(0), "{}: {}", spec.display(), r.stderr);
        // The spec's path is its path in the repository.
        let rel = spec.strip_prefix(repo_root()).unwrap().to_str().unwrap();
        assert!(
            r.stdout.contains(&format!("VOIDBOX_SPEC: {rel}\n")),
            "{}",
            r.stdout
        );
        let f = wf_dir.join(format!("voidbox-{i}.yml"));
        std::fs::write(&f, &r.stdout).unwrap();
        files.push(f);
    }
    assert!(files.len() >= 8, "{files:?}");
    let out = run_tool(
        &wheel_tool("check-jsonschema"),
        &["--builtin-schema", "vendor.github-workflows"],
        &files,
    );
    assert!(out.contains("ok -- validation done"), "{out}");
    let out = run_tool(&wheel_tool("actionlint"), &["-no-color"], &files);
    assert!(out.trim().is_empty(), "actionlint findings:\n{out}");
}

/// The node runner refuses, before any VM starts, an unknown node (listing the nodes), a
/// node without the inputs it needs, a missing input file (naming node and file), and a
/// non-empty `--outputs`.
#[test]
fn node_runner_usage_errors_stop_before_any_vm() {
    let dir = tempfile::tempdir().unwrap();
    let spec = repo_root().join("examples/fan-out.yaml");
    let spec = spec.to_str().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let ins = dir.path().join("in");
    std::fs::create_dir_all(ins.join("words")).unwrap();
    std::fs::write(ins.join("words/output"), "9\n").unwrap();
    let ins = ins.to_str().unwrap();
    let cwd = dir.path();
    let r = run_in(
        VOIDBOX,
        cwd,
        &["apply", spec, "--node", "nope", "--outputs", out],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("its nodes are: seed, words, upper, lines, collect"),
        "{}",
        r.stderr
    );
    let r = run_in(
        VOIDBOX,
        cwd,
        &["apply", spec, "--node", "collect", "--outputs", out],
    );
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr
            .contains("it takes the results of words, upper, lines; give them with --inputs DIR"),
        "{}",
        r.stderr
    );
    let r = run_in(
        VOIDBOX,
        cwd,
        &[
            "apply",
            spec,
            "--node",
            "collect",
            "--inputs",
            ins,
            "--outputs",
            out,
        ],
    );
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr
            .contains("node `collect` needs the output of `upper`")
            && r.stderr.contains("in/upper/output: no such file"),
        "{}",
        r.stderr
    );
    let r = run_in(VOIDBOX, cwd, &["apply", spec, "--node", "seed"]);
    assert_eq!(r.code, Some(2), "--node needs --outputs");
    assert!(
        r.stderr.contains("--node NAME needs --outputs DIR"),
        "{}",
        r.stderr
    );
    let r = run_in(VOIDBOX, cwd, &["apply", spec, "--inputs", ins]);
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("go with --node NAME or --final-output"),
        "{}",
        r.stderr
    );
    std::fs::create_dir_all(dir.path().join("full")).unwrap();
    std::fs::write(dir.path().join("full/x"), "").unwrap();
    let full = dir.path().join("full");
    let r = run_in(
        VOIDBOX,
        cwd,
        &[
            "apply",
            spec,
            "--node",
            "seed",
            "--outputs",
            full.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("not empty"), "{}", r.stderr);
    let r = run_in(
        VOIDBOX,
        cwd,
        &[
            "apply",
            spec,
            "--node",
            "seed",
            "--outputs",
            out,
            "--service",
            "web",
        ],
    );
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("NAME=ADDR"), "{}", r.stderr);
    // --dry-run prints the one node's plan, its inputs checked, and needs no --outputs.
    std::fs::create_dir_all(dir.path().join("in/seed")).unwrap();
    std::fs::write(dir.path().join("in/seed/output"), "a b\n").unwrap();
    let r = run_in(
        VOIDBOX,
        cwd,
        &[
            "apply",
            spec,
            "--node",
            "words",
            "--inputs",
            ins,
            "--dry-run",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("words") && !r.stdout.contains("collect"),
        "{}",
        r.stdout
    );
    // --final-output needs the final node's results.
    let r = run_in(
        VOIDBOX,
        cwd,
        &[
            "apply",
            spec,
            "--final-output",
            "--inputs",
            ins,
            "--outputs",
            out,
        ],
    );
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr
            .contains("the final output needs the output of `collect`"),
        "{}",
        r.stderr
    );
}

/// The exports of `examples/fan-out.yaml` in `docs/scale-out/` (docs/scale-out.md shows them) are
/// what `voidbox export` writes today.
#[test]
fn the_documented_exports_are_current() {
    let spec = repo_root().join("examples/fan-out.yaml");
    for (file, args) in [
        (
            "docs/scale-out/fan-out.argo.yaml",
            &[
                "--format",
                "argo",
                "--image",
                "ghcr.io/your-org/voidbox:0.1.0",
            ][..],
        ),
        (
            "docs/scale-out/fan-out.github.yml",
            &[
                "--format",
                "github-actions",
                "--voidbox-repo",
                "your-org/voidbox",
            ][..],
        ),
    ] {
        let r = export(&spec, args);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        let doc = std::fs::read_to_string(repo_root().join(file)).unwrap();
        assert!(
            r.stdout == doc,
            "{file} is stale: regenerate it with `voidbox export examples/fan-out.yaml {}`",
            args.join(" ")
        );
    }
}
